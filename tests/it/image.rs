//! The container image carries what the binary needs: every shared library `ldd` finds it
//! loading comes from a Debian package the runtime stage installs or its base image has, and
//! what librdkafka runs for Kerberos (`kinit`) is there too.

use std::collections::BTreeSet;
use std::process::Command;

/// Packages of `debian:bookworm-slim` the runtime stage relies on without installing them.
const BASE_IMAGE: [&str; 2] = ["libc6", "libgcc-s1"];

fn dockerfile() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap()
}

/// The packages a stage's `apt-get install` lines name.
fn installed_by(stage: &str) -> BTreeSet<String> {
    let mut packages = BTreeSet::new();
    let mut installing = false;
    for line in stage.lines() {
        let line = line.trim();
        if line.contains("apt-get install") {
            installing = true;
        }
        if !installing {
            continue;
        }
        let words = line
            .split("apt-get install")
            .last()
            .unwrap_or(line)
            .split_whitespace()
            .take_while(|word| *word != "&&");
        for word in words {
            if !word.starts_with('-') && word != "\\" {
                packages.insert(word.to_owned());
            }
        }
        if !line.ends_with('\\') || line.contains("&& rm") {
            installing = false;
        }
    }
    packages
}

/// The Dockerfile's stages: builder, then runtime.
fn stages() -> (String, String) {
    let text = dockerfile();
    let runtime = text
        .find("AS runtime")
        .expect("the Dockerfile has a runtime stage");
    (text[..runtime].to_owned(), text[runtime..].to_owned())
}

/// The Debian package that holds `path` (Debian's merged /usr lists some under /lib, some
/// under /usr/lib).
fn package_of(path: &str) -> String {
    let candidates = [
        path.to_owned(),
        format!("/usr{path}"),
        path.strip_prefix("/usr").unwrap_or(path).to_owned(),
    ];
    for candidate in candidates {
        let output = Command::new("dpkg").args(["-S", &candidate]).output();
        if let Ok(output) = output
            && output.status.success()
        {
            let text = String::from_utf8_lossy(&output.stdout);
            let package = text.split(':').next().unwrap_or_default().trim();
            return package.to_owned();
        }
    }
    panic!("no Debian package holds {path}");
}

#[test]
fn the_runtime_stage_carries_every_shared_library_the_binary_loads() {
    let output = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_history-service"))
        .output()
        .expect("ldd runs");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let (_, runtime) = stages();
    let mut available: BTreeSet<String> = installed_by(&runtime);
    available.extend(BASE_IMAGE.iter().map(|package| package.to_string()));
    let mut needed = BTreeSet::new();
    for line in text.lines() {
        // `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)`; the loader and the vDSO
        // come with the kernel and libc6.
        if let Some((_, resolved)) = line.split_once("=>") {
            let path = resolved.split_whitespace().next().unwrap_or_default();
            assert!(path.starts_with('/'), "not found: {line}");
            needed.insert((package_of(path), line.trim().to_owned()));
        }
    }
    assert!(!needed.is_empty(), "ldd listed nothing:\n{text}");
    for (package, line) in &needed {
        assert!(
            available.contains(package),
            "{line}: its package {package} is neither installed by the runtime stage nor in \
             the base image ({available:?})"
        );
    }
    // Every codec and Kerberos, SASL and libcurl are linked in: none of them is loaded.
    for linked_in in [
        "libzstd",
        "libz.so",
        "libsasl2",
        "libkrb5",
        "libgssapi",
        "libcurl",
    ] {
        assert!(!text.contains(linked_in), "{linked_in} is loaded:\n{text}");
    }
}

#[test]
fn the_runtime_stage_has_kinit_and_the_trust_store_and_the_builder_what_librdkafka_needs() {
    let (builder, runtime) = stages();
    let runtime = installed_by(&runtime);
    for package in ["krb5-user", "ca-certificates", "libssl3"] {
        assert!(
            runtime.contains(package),
            "runtime lacks {package}: {runtime:?}"
        );
    }
    let builder = installed_by(&builder);
    for package in ["libcurl4-openssl-dev", "g++", "make", "perl", "libssl-dev"] {
        assert!(
            builder.contains(package),
            "builder lacks {package}: {builder:?}"
        );
    }
}
