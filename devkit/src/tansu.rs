//! tansu (`cargo install tansu --features dynostore,libsql`), an independent Kafka-protocol
//! broker — not librdkafka's — that authenticates its clients: SASL PLAIN and
//! SCRAM-SHA-256/512 (checked against the credentials it stores), over plain TCP or TLS. The
//! embedded broker authenticates no one, so this is where the service's SASL is shown against a
//! live broker. Users and topics are created through tansu's own admin commands before
//! authentication is switched on (it refuses them unauthenticated afterwards): the broker runs
//! once without it on a SQLite store in a directory of its own, then again with it. TLS is
//! terminated in front of it by socat (OpenSSL; tansu 0.6's command line refuses its own
//! `--cert` together with `--key`), and tansu advertises the TLS port, so every connection of a
//! client is SASL_SSL end to end as the client sees it.
//! `scripts/test-tools.sh` installs it; a test that needs it and finds it missing fails, naming
//! what to install.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Process;

/// A SCRAM mechanism tansu stores credentials for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scram {
    Sha256,
    Sha512,
}

impl Scram {
    fn tansu_name(self) -> &'static str {
        match self {
            Scram::Sha256 => "scram256",
            Scram::Sha512 => "scram512",
        }
    }
}

/// What the broker is to have before authentication is switched on.
#[derive(Debug, Clone, Default)]
pub struct TansuSetup {
    /// Users: name, password and the SCRAM mechanism their credential is stored for.
    pub users: Vec<(String, String, Scram)>,
    /// Topics and their partition counts.
    pub topics: Vec<(String, i32)>,
    /// Serve TLS (SASL_SSL) with a certificate of its own for 127.0.0.1.
    pub tls: bool,
}

/// A running tansu broker requiring authentication.
pub struct TansuBroker {
    // Declared first, so the broker and its TLS front stop before their directory goes.
    process: Process,
    tls_front: Option<Process>,
    dir: PathBuf,
    /// Where clients connect: the TLS front's port, or tansu's own.
    port: u16,
}

/// The tansu binary: on `PATH`, or where `cargo install` puts it.
fn tansu_binary() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("tansu"))
        .find(|path| path.is_file());
    let cargo_bin = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".cargo/bin/tansu"))
        .filter(|path| path.is_file());
    on_path.or(cargo_bin).ok_or_else(|| {
        "tansu is not installed: run scripts/test-tools.sh (cargo install tansu --features \
         dynostore,libsql)"
            .to_owned()
    })
}

fn wait_listening(port: u16, process: &mut Process) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if process.exit_status().is_some() || Instant::now() > deadline {
            return Err(format!("tansu did not start:\n{}", process.logs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn run(binary: &Path, dir: &Path, args: &[&str]) -> Result<(), String> {
    let output = Command::new(binary)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|err| format!("tansu {args:?}: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tansu {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

impl TansuBroker {
    /// Starts a broker with `setup`'s users and topics, requiring authentication.
    pub fn start(setup: &TansuSetup) -> Result<Self, String> {
        let binary = tansu_binary()?;
        let dir =
            std::env::temp_dir().join(format!("history-tansu-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).map_err(|err| err.to_string())?;
        let free_port = || {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .map(|addr| addr.port())
                .map_err(|err| err.to_string())
        };
        let port = free_port()?;
        let tls_port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let start = |authentication: bool| -> Result<Process, String> {
            // Once TLS is on, clients are told to come back through the TLS front.
            let advertised = if authentication && setup.tls {
                format!("tcp://127.0.0.1:{tls_port}")
            } else {
                url.clone()
            };
            let mut command = Process::command(&binary)
                .args(["broker", "--listener-url", &url])
                .args(["--advertised-listener-url", &advertised])
                .args(["--storage-engine", "sqlite://tansu.db"])
                .env("RUST_LOG", "warn");
            if authentication {
                command = command.arg("--authentication");
            }
            // tansu keeps its SQLite store in its working directory.
            let mut process = command
                .current_dir(&dir)
                .spawn()
                .map_err(|err| format!("cannot start tansu: {err}"))?;
            wait_listening(port, &mut process)?;
            Ok(process)
        };

        let mut open = start(false)?;
        for (name, password, mechanism) in &setup.users {
            run(
                &binary,
                &dir,
                &[
                    "user",
                    "create",
                    "--broker",
                    &url,
                    name,
                    password,
                    "--mechanism",
                    mechanism.tansu_name(),
                ],
            )?;
        }
        for (topic, partitions) in &setup.topics {
            run(
                &binary,
                &dir,
                &[
                    "topic",
                    "create",
                    "--broker",
                    &url,
                    topic,
                    "--partitions",
                    &partitions.to_string(),
                ],
            )?;
        }
        open.stop(Duration::from_secs(10))
            .map_err(|err| err.to_string())?;
        if setup.tls {
            let subject = "/CN=127.0.0.1";
            let output = Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                ])
                .args(["-subj", subject, "-addext", "subjectAltName=IP:127.0.0.1"])
                .arg("-keyout")
                .arg(dir.join("key.pem"))
                .arg("-out")
                .arg(dir.join("cert.pem"))
                .output()
                .map_err(|err| format!("cannot run openssl: {err}"))?;
            if !output.status.success() {
                return Err(format!(
                    "openssl could not make a certificate: {}",
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
        let process = start(true)?;
        let tls_front = if setup.tls {
            let listen = format!(
                "openssl-listen:{tls_port},reuseaddr,fork,verify=0,cert={},key={}",
                dir.join("cert.pem").display(),
                dir.join("key.pem").display()
            );
            let mut front = Process::command("socat")
                .arg(listen)
                .arg(format!("tcp:127.0.0.1:{port}"))
                .spawn()
                .map_err(|err| format!("cannot start socat (Debian's socat): {err}"))?;
            wait_listening(tls_port, &mut front)?;
            Some(front)
        } else {
            None
        };
        Ok(TansuBroker {
            process,
            port: if setup.tls { tls_port } else { port },
            tls_front,
            dir,
        })
    }

    /// Where clients connect.
    pub fn bootstrap_servers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The certificate clients verify the broker with, when it serves TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls_front.as_ref().map(|_| self.dir.join("cert.pem"))
    }

    /// The broker's log so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        if let Some(front) = self.tls_front.as_mut() {
            front.kill();
        }
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
