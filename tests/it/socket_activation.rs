//! The endpoints on a listening socket handed over by the parent (`LISTEN_FDS`, as systemd's
//! socket activation and the test kit do): served from the first moment, before the database
//! answers; a `LISTEN_FDS` that names no socket fails the start with the reason.

use std::time::{Duration, Instant};

use history_devkit::probe;
use history_devkit::process::{Process, local_listener};

/// A database address nothing listens on: the service keeps retrying its migrations, while
/// the endpoints answer.
fn unreachable_database() -> String {
    let port = local_listener().unwrap().local_addr().unwrap().port();
    format!("postgres://postgres@127.0.0.1:{port}/none")
}

#[test]
fn the_service_serves_its_endpoints_on_a_handed_over_socket() {
    let listener = local_listener().unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut service = Process::command(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env_remove("HISTORY_CONFIG")
        .env("HISTORY__DATABASE__URL", unreachable_database())
        // Another address in the settings: the handed-over socket wins.
        .env("HISTORY__HTTP__LISTEN", "127.0.0.1:1")
        .hand_over(listener)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        match probe::get(port, "/healthz") {
            Ok(answer) => break answer,
            Err(err) => {
                assert!(
                    service.exit_status().is_none(),
                    "the service exited: {}",
                    service.logs()
                );
                assert!(Instant::now() < deadline, "no answer on {port}: {err}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert_eq!(answer, (200, "ok\n".to_owned()));
    let (status, body) = probe::get(port, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    let status = service.stop(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status:?}: {}", service.logs());
}

#[test]
fn a_listen_fds_without_a_socket_fails_the_start_with_the_reason() {
    let mut service = Process::command(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env_remove("HISTORY_CONFIG")
        .env("HISTORY__DATABASE__URL", unreachable_database())
        .env("LISTEN_FDS", "1")
        .spawn()
        .unwrap();
    let status = service.wait_exit(Duration::from_secs(30)).unwrap();
    assert_eq!(status.code(), Some(2), "{}", service.logs());
    assert!(service.logs().contains("LISTEN_FDS"), "{}", service.logs());
}
