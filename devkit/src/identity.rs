//! The identity services Kafka clients authenticate against, run for real on this machine:
//! an OpenID Connect provider (npm's `oauth2-mock-server`, signing RS256 tokens, behind
//! `devkit/node/oidc-provider.mjs`) and an MIT Kerberos KDC (Debian's `krb5-kdc`, with a realm
//! of its own in a temporary directory). `scripts/test-tools.sh` installs both; a test that
//! needs one and finds it missing fails, naming what to install.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::Process;

/// Where `scripts/test-tools.sh` installs the test's npm packages.
pub fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the devkit lives in the workspace")
        .join("target/test-tools")
}

/// The provider script (`devkit/node/oidc-provider.mjs`).
const OIDC_PROVIDER: &str = include_str!("../node/oidc-provider.mjs");

/// An OpenID Connect provider on a local port.
pub struct OidcProvider {
    process: Process,
    /// Its issuer URL, `http://localhost:PORT`.
    pub url: String,
}

impl OidcProvider {
    /// Starts the provider; fails if node or the package is missing.
    pub fn start() -> Result<Self, String> {
        let dir = tools_dir();
        if !dir.join("node_modules/oauth2-mock-server").is_dir() {
            return Err(format!(
                "oauth2-mock-server is not installed in {}: run scripts/test-tools.sh",
                dir.display()
            ));
        }
        // ES modules resolve their imports from where the script is: beside node_modules.
        let script = dir.join("oidc-provider.mjs");
        std::fs::write(&script, OIDC_PROVIDER).map_err(|err| err.to_string())?;
        let mut process = Process::command("node")
            .arg(&script)
            .spawn()
            .map_err(|err| format!("cannot start the OIDC provider (is node installed?): {err}"))?;
        let line = process
            .wait_for_line("\"listening\"", Duration::from_secs(20))
            .ok_or_else(|| format!("the OIDC provider did not start:\n{}", process.logs()))?;
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|err| format!("{line}: {err}"))?;
        let url = value["url"].as_str().ok_or("no url")?.to_owned();
        Ok(OidcProvider { process, url })
    }

    /// Its token endpoint.
    pub fn token_endpoint(&self) -> String {
        format!("{}/token", self.url)
    }

    /// Every token request it answered so far: the grant, the scope and the Authorization
    /// header the client sent.
    pub fn token_requests(&self) -> Vec<serde_json::Value> {
        self.process
            .logs()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|value| value["event"] == "token")
            .collect()
    }
}

/// An MIT Kerberos KDC with a realm of its own, listening on a local port (UDP and TCP).
pub struct Kdc {
    // Declared first, so the KDC stops before its directory goes.
    process: Process,
    dir: PathBuf,
    pub realm: String,
}

/// Where Debian keeps the KDC's programs.
fn kerberos_tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin"] {
        let path = Path::new(dir).join(name);
        if path.is_file() {
            return path;
        }
    }
    PathBuf::from(name)
}

impl Kdc {
    /// Creates the realm `realm` (its database, a master key) and starts its KDC.
    pub fn start(realm: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("history-kdc-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).map_err(|err| err.to_string())?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|err| err.to_string())?
            .port();
        let kdc_conf = format!(
            "[kdcdefaults]\n kdc_ports = {port}\n kdc_tcp_ports = {port}\n\
             [realms]\n {realm} = {{\n  database_name = {db}\n  key_stash_file = {stash}\n  \
             acl_file = {acl}\n  max_life = 1h\n }}\n\
             [logging]\n kdc = FILE:{log}\n",
            db = dir.join("principal").display(),
            stash = dir.join("stash").display(),
            acl = dir.join("kadm5.acl").display(),
            log = dir.join("kdc.log").display(),
        );
        let krb5_conf = format!(
            "[libdefaults]\n default_realm = {realm}\n dns_lookup_kdc = false\n \
             dns_lookup_realm = false\n dns_canonicalize_hostname = false\n rdns = false\n \
             udp_preference_limit = 1\n\
             [realms]\n {realm} = {{\n  kdc = 127.0.0.1:{port}\n }}\n"
        );
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|err| format!("{name}: {err}"))
        };
        write("kdc.conf", &kdc_conf)?;
        write("krb5.conf", &krb5_conf)?;
        write("kadm5.acl", "")?;
        let env = realm_env(&dir);
        run_tool(
            &env,
            "kdb5_util",
            &[
                "-r",
                realm,
                "-P",
                "master-key-of-the-test-realm",
                "create",
                "-s",
            ],
        )?;
        let process = Process::command(kerberos_tool("krb5kdc"))
            .args(["-n", "-r", realm])
            .envs(&env)
            .spawn()
            .map_err(|err| format!("cannot start krb5kdc (Debian's krb5-kdc): {err}"))?;
        let kdc = Kdc {
            process,
            dir,
            realm: realm.to_owned(),
        };
        // Up once it answers on its TCP port.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                return Err(format!("krb5kdc did not start:\n{}", kdc.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(kdc)
    }

    /// The environment the Kerberos tools (and a client) need for this realm.
    pub fn env(&self) -> Vec<(String, String)> {
        realm_env(&self.dir)
    }

    /// The client configuration naming this realm's KDC.
    pub fn krb5_conf(&self) -> PathBuf {
        self.dir.join("krb5.conf")
    }

    /// A directory of the realm's, for keytabs and ticket caches.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<String, String> {
        run_tool(&self.env(), tool, args)
    }

    /// Adds a principal with a random key (`kafka/127.0.0.1`, for `kafka/127.0.0.1@REALM`).
    pub fn add_principal(&self, name: &str) -> Result<(), String> {
        let query = format!("addprinc -randkey {name}@{}", self.realm);
        self.run("kadmin.local", &["-r", &self.realm, "-q", &query])
            .map(|_| ())
    }

    /// Adds a principal and writes its keys to a keytab; returns the keytab's path.
    pub fn add_principal_with_keytab(&self, name: &str) -> Result<PathBuf, String> {
        self.add_principal(name)?;
        let keytab = self.dir.join(format!("{}.keytab", name.replace('/', "_")));
        let query = format!("ktadd -k {} {name}@{}", keytab.display(), self.realm);
        self.run("kadmin.local", &["-r", &self.realm, "-q", &query])?;
        Ok(keytab)
    }

    /// The KDC's log: a line per ticket request (`AS_REQ`, `TGS_REQ`) with its client, its
    /// service and whether it issued one.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kdc.log")).unwrap_or_default()
    }
}

/// The environment naming a realm's files in `dir`.
fn realm_env(dir: &Path) -> Vec<(String, String)> {
    vec![
        (
            "KRB5_CONFIG".into(),
            dir.join("krb5.conf").display().to_string(),
        ),
        (
            "KRB5_KDC_PROFILE".into(),
            dir.join("kdc.conf").display().to_string(),
        ),
    ]
}

/// Runs a Kerberos administration tool in a realm's environment.
fn run_tool(env: &[(String, String)], tool: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(kerberos_tool(tool))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|err| {
            format!("cannot run {tool} (Debian's krb5-kdc and krb5-admin-server): {err}")
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("{tool} {args:?} failed: {text}"))
    }
}

impl Drop for Kdc {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
