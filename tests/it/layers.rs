//! The layers of lib.rs, kept: the pure core (domain, offsets) imports nothing of the actors,
//! Kafka, PostgreSQL or any I/O crate; the store knows nothing of actors, Kafka or the app;
//! metrics know nothing of the actors. Read from the sources, so a new import that breaks the
//! layering fails here, naming the file and the line.

use std::path::{Path, PathBuf};

fn sources(under: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(under);
    if root.is_file() {
        return vec![root];
    }
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// Lines of the sources under `under` that mention any of `forbidden` as a path.
fn offending(under: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(under) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for path in forbidden {
                let used = code.contains(&format!("{path}::"))
                    || code.trim_start().starts_with(&format!("use {path}"));
                if used {
                    found.push(format!(
                        "{}:{}: {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

const OUTSIDE_THE_CORE: [&str; 15] = [
    "crate::actors",
    "crate::kafka",
    "crate::store",
    "crate::app",
    "crate::http",
    "crate::cli",
    "crate::metrics",
    "crate::health",
    "crate::config",
    "actix",
    "rdkafka",
    "tokio_postgres",
    "bb8",
    "tokio",
    "actix_web",
];

#[test]
fn the_core_imports_nothing_of_actors_kafka_postgresql_or_io() {
    for core in ["domain", "offsets"] {
        let found = offending(core, &OUTSIDE_THE_CORE);
        assert!(
            found.is_empty(),
            "the core reaches out:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn the_store_knows_nothing_of_actors_kafka_or_the_app() {
    let found = offending(
        "store",
        &[
            "crate::actors",
            "crate::kafka",
            "crate::app",
            "crate::http",
            "crate::cli",
        ],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn metrics_know_nothing_of_the_actors_or_kafka() {
    let found = offending("metrics.rs", &["crate::actors", "crate::kafka"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
