//! The operator's endpoints on `http.listen`: `/metrics` (Prometheus text format), `/healthz`
//! (the process is alive) and `/readyz` (the consumer has joined its group and the database
//! answers). Nothing else is served.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::metrics as names;
use crate::store::PgPool;

/// What readiness depends on.
#[derive(Clone)]
pub struct Health {
    pub joined: Arc<AtomicBool>,
    pub pool: PgPool,
}

impl Health {
    /// Why the service is not ready, or `None` if it is.
    pub async fn not_ready_reason(&self) -> Option<&'static str> {
        if !self.joined.load(Ordering::Relaxed) {
            return Some("the consumer has not joined its group yet");
        }
        let probe = async {
            let conn = self.pool.get().await.ok()?;
            conn.client.simple_query("SELECT 1").await.ok()
        };
        match tokio::time::timeout(Duration::from_secs(2), probe).await {
            Ok(Some(_)) => None,
            _ => Some("the database does not answer"),
        }
    }
}

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
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

async fn readyz(health: web::Data<Health>) -> HttpResponse {
    match health.not_ready_reason().await {
        None => HttpResponse::Ok().body("ready\n"),
        Some(reason) => HttpResponse::ServiceUnavailable().body(format!("not ready: {reason}\n")),
    }
}

/// Binds the endpoints and runs them on the current actix system. Returns the handle that
/// stops them, and the bound address (port 0 picks a free one).
pub fn serve(listen: SocketAddr, health: Health) -> std::io::Result<(ServerHandle, SocketAddr)> {
    let handle = prometheus();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(handle.clone()))
            .app_data(web::Data::new(health.clone()))
            .route("/metrics", web::get().to(metrics_endpoint))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(listen)?;
    let bound = server.addrs().first().copied().unwrap_or(listen);
    let server = server.run();
    let stop = server.handle();
    actix_rt::spawn(server);
    Ok((stop, bound))
}
