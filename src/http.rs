//! The operator's endpoints on `http.listen`: `/metrics` (Prometheus text format), `/healthz`
//! (the process is alive) and `/readyz` (the service can consume and write; see
//! [`crate::health`]). Served from the first moment of `run`, before migrations. GET and HEAD
//! only; nothing else is served.
//!
//! The endpoints bind `http.listen`, or serve a listening socket handed over by the process
//! that started the service (systemd socket activation, `LISTEN_FDS`; the tests do the same to
//! get an OS-assigned port without a pick-then-bind race).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::health::Readiness;
use crate::metrics as names;

/// How often the `history_ready` gauge is brought up to date when nobody asks `/readyz`.
const READY_GAUGE_INTERVAL: Duration = Duration::from_secs(1);

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub fn prometheus() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let latency = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ];
            let sizes = [1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0];
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(names::TRANSACTION_SECONDS.into()), &latency)
                .and_then(|builder| {
                    builder
                        .set_buckets_for_metric(Matcher::Full(names::BATCH_EVENTS.into()), &sizes)
                })
                .expect("bucket lists are not empty")
                .install_recorder()
                .expect("no other metrics recorder is installed")
        })
        .clone()
}

async fn metrics_endpoint(handle: web::Data<PrometheusHandle>) -> HttpResponse {
    handle.run_upkeep();
    crate::metrics::sample_for_scrape();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

async fn readyz(readiness: web::Data<Readiness>) -> HttpResponse {
    match readiness.check().await {
        None => HttpResponse::Ok().body("ready\n"),
        Some(reason) => HttpResponse::ServiceUnavailable().body(format!("not ready: {reason}\n")),
    }
}

/// The running endpoints, and the task keeping the `history_ready` gauge current.
pub struct Endpoints {
    server: ServerHandle,
    gauge: tokio::task::JoinHandle<()>,
}

impl Endpoints {
    /// Stops serving; `graceful` lets requests in progress finish.
    pub async fn stop(self, graceful: bool) {
        self.gauge.abort();
        self.server.stop(graceful).await;
    }
}

/// Where the endpoints listen.
#[derive(Debug)]
pub enum Listen {
    /// Bind this address (port 0 picks a free one).
    Bind(SocketAddr),
    /// Serve a socket already bound and listening.
    Handed(std::net::TcpListener),
}

/// The listening socket handed over through `LISTEN_FDS` (the systemd socket-activation
/// protocol; `LISTEN_PID`, when set, must name this process), if any. Call before other
/// threads start: it clears those variables from the environment.
pub fn handed_over_listener() -> std::io::Result<Option<std::net::TcpListener>> {
    listenfd::ListenFd::from_env().take_tcp_listener(0)
}

/// Binds the endpoints and runs them on the current actix system. Returns their handle and the
/// address they serve.
pub fn serve(listen: Listen, readiness: Readiness) -> std::io::Result<(Endpoints, SocketAddr)> {
    let handle = prometheus();
    let app_readiness = readiness.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(handle.clone()))
            .app_data(web::Data::new(app_readiness.clone()))
            // A resource answers other methods with 405 and an `Allow` header.
            .service(
                web::resource("/metrics")
                    .route(web::get().to(metrics_endpoint))
                    .route(web::head().to(metrics_endpoint)),
            )
            .service(
                web::resource("/healthz")
                    .route(web::get().to(healthz))
                    .route(web::head().to(healthz)),
            )
            .service(
                web::resource("/readyz")
                    .route(web::get().to(readyz))
                    .route(web::head().to(readyz)),
            )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1);
    let server = match listen {
        Listen::Bind(addr) => server.bind(addr)?,
        Listen::Handed(listener) => server.listen(listener)?,
    };
    let bound = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| std::io::Error::other("the HTTP server has no address"))?;
    let server = server.run();
    let stop = server.handle();
    actix_rt::spawn(server);
    let gauge = actix_rt::spawn(async move {
        let mut ticks = tokio::time::interval(READY_GAUGE_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            readiness.check().await;
        }
    });
    Ok((
        Endpoints {
            server: stop,
            gauge,
        },
        bound,
    ))
}
