//! Whether the configured authentication can work, checked at start-up before any database or
//! broker work: librdkafka finds most of these only when a client is created, and some never
//! (a keytab it cannot read makes `kinit` fail in the background, and the consumer then retries
//! an authentication that cannot succeed, forever).
//!
//! Each refusal names the property (`kafka.properties.sasl.kerberos.keytab`) and what to do,
//! never a value. What is checked, by `security.protocol`:
//! - `PLAINTEXT`, `SSL`: no `sasl.*` property may be set (it would be silently unused);
//! - `SASL_PLAINTEXT`, `SASL_SSL`: the mechanism (`sasl.mechanism`, librdkafka's default
//!   `GSSAPI`) is one librdkafka has, spelled as librdkafka compares it (upper case), and what
//!   it needs is there: a user name and a password for PLAIN and SCRAM; for GSSAPI with
//!   librdkafka's `kinit` login, a principal, a readable keytab, the `kinit` program and a
//!   Kerberos configuration; for OAUTHBEARER, `sasl.oauthbearer.method=oidc` (the service
//!   registers no token callback of its own) with a token endpoint URL and the grant's
//!   credentials.
//!
//! Every file a property names (CA, certificate, key, keytab, assertion key) must be readable.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};

/// The SASL mechanisms librdkafka offers, as it spells them.
pub(crate) const MECHANISMS: [&str; 5] = [
    "PLAIN",
    "SCRAM-SHA-256",
    "SCRAM-SHA-512",
    "GSSAPI",
    "OAUTHBEARER",
];

/// Properties that name a file librdkafka reads at start-up.
const FILE_PROPERTIES: [&str; 8] = [
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
    "sasl.kerberos.keytab",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.file",
];

/// librdkafka's default `sasl.kerberos.kinit.cmd`: it logs in from the keytab with `kinit`.
const DEFAULT_KINIT_CMD: &str = "kinit -R -t \"%{sasl.kerberos.keytab}\" -k \
     %{sasl.kerberos.principal} || kinit -t \"%{sasl.kerberos.keytab}\" -k \
     %{sasl.kerberos.principal}";

/// A refused authentication setting: the librdkafka property it concerns and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub property: &'static str,
    pub reason: String,
}

impl Refusal {
    fn new(property: &'static str, reason: impl Into<String>) -> Self {
        Refusal {
            property,
            reason: reason.into(),
        }
    }
}

/// What the checks need of the machine the service runs on.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `PATH`, where `kinit` is looked for.
    pub path: Option<OsString>,
    /// `KRB5_CONFIG`, if set; otherwise Kerberos reads `/etc/krb5.conf`.
    pub krb5_config: Option<OsString>,
}

impl Host {
    /// This process's environment.
    pub(crate) fn current() -> Host {
        Host {
            path: std::env::var_os("PATH"),
            krb5_config: std::env::var_os("KRB5_CONFIG"),
        }
    }

    fn finds_program(&self, program: &str) -> bool {
        if program.contains('/') {
            return is_executable(Path::new(program));
        }
        self.path.as_ref().is_some_and(|path| {
            std::env::split_paths(path).any(|dir| is_executable(&dir.join(program)))
        })
    }

    /// The Kerberos configuration files Kerberos would read; none of them exists if empty.
    fn krb5_configs(&self) -> Vec<PathBuf> {
        match &self.krb5_config {
            Some(list) => std::env::split_paths(list).collect(),
            None => vec![PathBuf::from("/etc/krb5.conf")],
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The merged pass-through properties, read by name.
struct Properties<'a>(&'a BTreeMap<String, SecretString>);

impl Properties<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(|value| value.expose_secret())
            .filter(|value| !value.trim().is_empty())
    }

    /// The value of a property that has an alias (`sasl.mechanism` for `sasl.mechanisms`).
    fn either(&self, key: &'static str, alias: &'static str) -> Option<(&'static str, &str)> {
        self.get(key)
            .map(|value| (key, value))
            .or_else(|| self.get(alias).map(|value| (alias, value)))
    }
}

/// Checks the configured authentication; `properties` are the merged pass-through properties
/// (`kafka.properties` and the values read for `kafka.property_files`).
pub(crate) fn check(
    properties: &BTreeMap<String, SecretString>,
    host: &Host,
) -> Result<(), Refusal> {
    let props = Properties(properties);
    for key in FILE_PROPERTIES {
        if let Some(path) = props.get(key) {
            readable(key, path)?;
        }
    }
    let protocol = props
        .get("security.protocol")
        .unwrap_or("plaintext")
        .to_ascii_lowercase();
    let uses_sasl = protocol.starts_with("sasl_");
    if !uses_sasl {
        if let Some(key) = properties
            .keys()
            .find(|key| key.starts_with("sasl.") && props.get(key).is_some())
        {
            return Err(Refusal {
                property: "security.protocol",
                reason: format!(
                    "is {protocol}, which uses no SASL, but `{key}` is set: set \
                     security.protocol to SASL_SSL (or SASL_PLAINTEXT) to authenticate with \
                     SASL, or remove the sasl.* properties"
                ),
            });
        }
        return Ok(());
    }
    let (mechanism_key, mechanism) = props
        .either("sasl.mechanisms", "sasl.mechanism")
        .unwrap_or(("sasl.mechanism", "GSSAPI"));
    match mechanism {
        "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
            for key in ["sasl.username", "sasl.password"] {
                if props.get(key).is_none() {
                    return Err(Refusal::new(
                        key,
                        format!(
                            "is required by sasl.mechanism {mechanism} (give the password \
                             through kafka.property_files or \
                             HISTORY__KAFKA__PROPERTIES__SASL_PASSWORD)"
                        ),
                    ));
                }
            }
            Ok(())
        }
        "GSSAPI" => check_kerberos(&props, host),
        "OAUTHBEARER" => check_oauthbearer(&props),
        other => {
            let suggestion = MECHANISMS
                .iter()
                .find(|known| known.eq_ignore_ascii_case(other.trim()))
                .map(|known| format!(" (write it {known}: librdkafka compares it exactly)"))
                .unwrap_or_default();
            Err(Refusal::new(
                mechanism_key,
                format!(
                    "is not a SASL mechanism librdkafka offers{suggestion}; choose one of {}",
                    MECHANISMS.join(", ")
                ),
            ))
        }
    }
}

/// GSSAPI (Kerberos). With librdkafka's own login (`sasl.kerberos.min.time.before.relogin`
/// other than 0), it runs `sasl.kerberos.kinit.cmd` — by default `kinit` with the keytab and
/// the principal — at start-up and then periodically; a failure there is only logged, and
/// every connection then fails to authenticate. Without it, the ticket cache must be filled by
/// someone else (a sidecar), which the service cannot check.
fn check_kerberos(props: &Properties<'_>, host: &Host) -> Result<(), Refusal> {
    if !host.krb5_configs().iter().any(|path| path.is_file()) {
        return Err(Refusal::new(
            "sasl.mechanism",
            "GSSAPI needs a Kerberos configuration (realm, KDCs): /etc/krb5.conf, or the files \
             KRB5_CONFIG names, and none of them exists (mount krb5.conf from a ConfigMap)",
        ));
    }
    if props.get("sasl.kerberos.min.time.before.relogin") == Some("0") {
        return Ok(());
    }
    let command = props
        .get("sasl.kerberos.kinit.cmd")
        .unwrap_or(DEFAULT_KINIT_CMD);
    let program = command.split_whitespace().next().unwrap_or("kinit");
    if !host.finds_program(program) {
        return Err(Refusal::new(
            "sasl.kerberos.kinit.cmd",
            format!(
                "runs `{program}`, which is not on PATH: librdkafka logs in from the keytab \
                 with it (Debian's krb5-user package; the image carries it), or set \
                 sasl.kerberos.min.time.before.relogin = 0 if a sidecar keeps the ticket cache"
            ),
        ));
    }
    if command.contains("%{sasl.kerberos.principal}")
        && props.get("sasl.kerberos.principal").is_none()
    {
        return Err(Refusal::new(
            "sasl.kerberos.principal",
            "is required by GSSAPI with a keytab login (librdkafka's default, `kafkaclient`, \
             is no one's principal): set this service's principal, e.g. history@EXAMPLE.COM",
        ));
    }
    if command.contains("%{sasl.kerberos.keytab}") && props.get("sasl.kerberos.keytab").is_none() {
        return Err(Refusal::new(
            "sasl.kerberos.keytab",
            "is required by GSSAPI with a keytab login: the path of the principal's keytab \
             (mounted from a Secret)",
        ));
    }
    Ok(())
}

/// OAUTHBEARER. The service registers no token callback, so a token can only come from
/// librdkafka's OIDC client (`sasl.oauthbearer.method=oidc`), or, for tests against a broker
/// that accepts them, from unsecured JWTs.
fn check_oauthbearer(props: &Properties<'_>) -> Result<(), Refusal> {
    let oidc = props
        .get("sasl.oauthbearer.method")
        .is_some_and(|method| method.eq_ignore_ascii_case("oidc"));
    let unsecure = props
        .get("enable.sasl.oauthbearer.unsecure.jwt")
        .is_some_and(|value| matches!(value.to_ascii_lowercase().as_str(), "true" | "t" | "1"));
    if !oidc {
        if unsecure {
            return Ok(());
        }
        return Err(Refusal::new(
            "sasl.oauthbearer.method",
            "must be oidc with OAUTHBEARER: the service has no token callback of its own, so \
             librdkafka's OIDC client fetches the tokens (with sasl.oauthbearer.token.endpoint.url, \
             .client.id and .client.secret)",
        ));
    }
    if unsecure {
        return Err(Refusal::new(
            "enable.sasl.oauthbearer.unsecure.jwt",
            "cannot be combined with sasl.oauthbearer.method = oidc: remove it",
        ));
    }
    match props.get("sasl.oauthbearer.token.endpoint.url") {
        None => {
            return Err(Refusal::new(
                "sasl.oauthbearer.token.endpoint.url",
                "is required by sasl.oauthbearer.method = oidc: the identity provider's token \
                 endpoint (e.g. https://idp.example.com/oauth2/token)",
            ));
        }
        Some(url) => {
            let scheme = url::Url::parse(url).map(|url| url.scheme().to_owned());
            if !matches!(scheme.as_deref(), Ok("https" | "http")) {
                return Err(Refusal::new(
                    "sasl.oauthbearer.token.endpoint.url",
                    "is not an http(s) URL",
                ));
            }
        }
    }
    let jwt_bearer = props
        .get("sasl.oauthbearer.grant.type")
        .is_some_and(|grant| grant.contains("jwt-bearer"));
    if jwt_bearer {
        let key_file = props.get("sasl.oauthbearer.assertion.private.key.file");
        let key_pem = props.get("sasl.oauthbearer.assertion.private.key.pem");
        let assertion = props.get("sasl.oauthbearer.assertion.file");
        if key_file.is_none() && key_pem.is_none() && assertion.is_none() {
            return Err(Refusal::new(
                "sasl.oauthbearer.assertion.private.key.file",
                "(or sasl.oauthbearer.assertion.private.key.pem, or sasl.oauthbearer.assertion.file) \
                 is required by the jwt-bearer grant",
            ));
        }
        return Ok(());
    }
    for key in [
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
    ] {
        if props.get(key).is_none() {
            return Err(Refusal::new(
                key,
                "is required by sasl.oauthbearer.method = oidc with the client_credentials grant",
            ));
        }
    }
    Ok(())
}

fn readable(key: &'static str, path: &str) -> Result<(), Refusal> {
    let path = Path::new(path);
    match std::fs::File::open(path) {
        Ok(file) if file.metadata().is_ok_and(|meta| meta.is_file()) => Ok(()),
        Ok(_) => Err(Refusal::new(
            key,
            format!("{} is not a file", path.display()),
        )),
        Err(err) => Err(Refusal::new(
            key,
            format!("cannot read {}: {err}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretString::from(v.to_string())))
            .collect()
    }

    /// A directory with a `kinit` program, a krb5.conf and a keytab, for the Kerberos checks.
    struct Kerberos {
        dir: PathBuf,
    }

    impl Kerberos {
        fn new() -> Self {
            use std::os::unix::fs::PermissionsExt;
            let dir = std::env::temp_dir().join(format!(
                "history-auth-{}-{}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let kinit = dir.join("kinit");
            std::fs::write(&kinit, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&kinit, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::write(dir.join("krb5.conf"), "[libdefaults]\n").unwrap();
            std::fs::write(dir.join("history.keytab"), b"\x05\x02").unwrap();
            Kerberos { dir }
        }

        fn host(&self) -> Host {
            Host {
                path: Some(self.dir.clone().into_os_string()),
                krb5_config: Some(self.dir.join("krb5.conf").into_os_string()),
            }
        }

        fn keytab(&self) -> String {
            self.dir.join("history.keytab").display().to_string()
        }
    }

    impl Drop for Kerberos {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn refused(pairs: &[(&str, &str)], host: &Host) -> Refusal {
        check(&props(pairs), host).expect_err("expected a refusal")
    }

    fn nowhere() -> Host {
        Host {
            path: Some(OsString::from("/nonexistent")),
            krb5_config: Some(OsString::from("/nonexistent/krb5.conf")),
        }
    }

    #[test]
    fn no_security_settings_need_nothing() {
        check(&props(&[]), &nowhere()).unwrap();
        check(&props(&[("security.protocol", "SSL")]), &nowhere()).unwrap();
    }

    #[test]
    fn sasl_settings_without_a_sasl_protocol_are_refused() {
        let refusal = refused(&[("sasl.mechanism", "PLAIN")], &nowhere());
        assert_eq!(refusal.property, "security.protocol");
        assert!(refusal.reason.contains("sasl.mechanism"), "{refusal:?}");
    }

    #[test]
    fn plain_and_scram_need_a_user_and_a_password() {
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let refusal = refused(
                &[
                    ("security.protocol", "SASL_SSL"),
                    ("sasl.mechanism", mechanism),
                ],
                &nowhere(),
            );
            assert_eq!(refusal.property, "sasl.username", "{mechanism}");
            let refusal = refused(
                &[
                    ("security.protocol", "sasl_ssl"),
                    ("sasl.mechanisms", mechanism),
                    ("sasl.username", "history"),
                ],
                &nowhere(),
            );
            assert_eq!(refusal.property, "sasl.password", "{mechanism}");
            check(
                &props(&[
                    ("security.protocol", "SASL_SSL"),
                    ("sasl.mechanism", mechanism),
                    ("sasl.username", "history"),
                    ("sasl.password", "secret"),
                ]),
                &nowhere(),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_mechanism_is_named_as_librdkafka_spells_it() {
        let refusal = refused(
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "scram-sha-512"),
            ],
            &nowhere(),
        );
        assert_eq!(refusal.property, "sasl.mechanism");
        assert!(
            refusal.reason.contains("write it SCRAM-SHA-512"),
            "{refusal:?}"
        );
        let refusal = refused(
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanisms", "NTLM"),
            ],
            &nowhere(),
        );
        assert_eq!(refusal.property, "sasl.mechanisms");
        assert!(
            refusal.reason.contains("GSSAPI, OAUTHBEARER"),
            "{refusal:?}"
        );
    }

    #[test]
    fn gssapi_with_a_keytab_login_needs_a_principal_a_keytab_kinit_and_krb5_conf() {
        let kerberos = Kerberos::new();
        let host = kerberos.host();
        let keytab = kerberos.keytab();
        let good = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "GSSAPI"),
            ("sasl.kerberos.principal", "history@EXAMPLE.COM"),
            ("sasl.kerberos.keytab", keytab.as_str()),
        ];
        check(&props(&good), &host).unwrap();

        // The default mechanism of a SASL protocol is GSSAPI.
        let refusal = refused(&[("security.protocol", "SASL_PLAINTEXT")], &host);
        assert_eq!(refusal.property, "sasl.kerberos.principal");
        let refusal = refused(&good[..3], &host);
        assert_eq!(refusal.property, "sasl.kerberos.keytab");
        let missing = kerberos.dir.join("gone.keytab").display().to_string();
        let mut unreadable = good;
        unreadable[3] = ("sasl.kerberos.keytab", missing.as_str());
        let refusal = refused(&unreadable, &host);
        assert_eq!(refusal.property, "sasl.kerberos.keytab");
        assert!(refusal.reason.contains("cannot read"), "{refusal:?}");

        let no_kinit = Host {
            path: Some(OsString::from("/nonexistent")),
            ..host.clone()
        };
        let refusal = refused(&good, &no_kinit);
        assert_eq!(refusal.property, "sasl.kerberos.kinit.cmd");
        assert!(refusal.reason.contains("krb5-user"), "{refusal:?}");
        // A ticket cache kept by someone else needs no kinit.
        let mut external = good.to_vec();
        external.push(("sasl.kerberos.min.time.before.relogin", "0"));
        check(&props(&external), &no_kinit).unwrap();

        let no_config = Host {
            krb5_config: Some(kerberos.dir.join("absent.conf").into_os_string()),
            ..host
        };
        let refusal = refused(&good, &no_config);
        assert_eq!(refusal.property, "sasl.mechanism");
        assert!(refusal.reason.contains("krb5.conf"), "{refusal:?}");
    }

    #[test]
    fn oauthbearer_needs_oidc_with_a_token_endpoint_and_client_credentials() {
        let base = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
        ];
        assert_eq!(
            refused(&base, &nowhere()).property,
            "sasl.oauthbearer.method"
        );
        let mut oidc = base.to_vec();
        oidc.push(("sasl.oauthbearer.method", "oidc"));
        assert_eq!(
            refused(&oidc, &nowhere()).property,
            "sasl.oauthbearer.token.endpoint.url"
        );
        oidc.push((
            "sasl.oauthbearer.token.endpoint.url",
            "idp.example.com/token",
        ));
        assert!(
            refused(&oidc, &nowhere())
                .reason
                .contains("not an http(s) URL"),
            "a URL without a scheme"
        );
        oidc.pop();
        oidc.push((
            "sasl.oauthbearer.token.endpoint.url",
            "https://idp.example.com/oauth2/token",
        ));
        assert_eq!(
            refused(&oidc, &nowhere()).property,
            "sasl.oauthbearer.client.id"
        );
        oidc.push(("sasl.oauthbearer.client.id", "history"));
        assert_eq!(
            refused(&oidc, &nowhere()).property,
            "sasl.oauthbearer.client.secret"
        );
        oidc.push(("sasl.oauthbearer.client.secret", "s3cr3t"));
        check(&props(&oidc), &nowhere()).unwrap();
        oidc.push(("enable.sasl.oauthbearer.unsecure.jwt", "true"));
        assert_eq!(
            refused(&oidc, &nowhere()).property,
            "enable.sasl.oauthbearer.unsecure.jwt"
        );
        let mut unsecured = base.to_vec();
        unsecured.push(("enable.sasl.oauthbearer.unsecure.jwt", "true"));
        check(&props(&unsecured), &nowhere()).unwrap();
    }

    #[test]
    fn every_file_a_property_names_must_be_readable() {
        for key in FILE_PROPERTIES {
            let refusal = refused(&[(key, "/nonexistent/file.pem")], &nowhere());
            assert_eq!(refusal.property, key);
            assert!(
                refusal.reason.contains("/nonexistent/file.pem"),
                "{refusal:?}"
            );
        }
    }
}
