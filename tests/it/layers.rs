//! The layers of lib.rs, kept: the pure core (domain, offsets) imports nothing of the actors,
//! Kafka, PostgreSQL or any I/O crate; config knows nothing of PostgreSQL, librdkafka or the
//! layers above; the store knows nothing of actors, Kafka or the app; Kafka knows nothing of the
//! actors or the app; metrics know nothing of the actors. Above those, the file-level import graph of `src/`:
//! no file imports a layer above its own, and no files import each other round a circle. Read
//! from the sources, so a new import that breaks the layering fails here, naming the file and
//! the line.

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

#[test]
fn kafka_knows_nothing_of_the_actors_or_the_app() {
    let found = offending(
        "kafka",
        &["crate::actors", "crate::app", "crate::http", "crate::cli"],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn config_knows_nothing_of_postgresql_kafka_or_the_layers_above() {
    let found = offending(
        "config.rs",
        &[
            "tokio_postgres",
            "rdkafka",
            "crate::store",
            "crate::kafka",
            "crate::metrics",
            "crate::health",
            "crate::actors",
            "crate::app",
            "crate::http",
            "crate::cli",
        ],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The layers of lib.rs, lowest first, by the crate's top-level modules.
const LAYERS: [&[&str]; 5] = [
    &["domain", "offsets"],
    &["config"],
    &[
        "store",
        "kafka",
        "metrics",
        "health",
        "telemetry",
        "replica",
    ],
    &["actors"],
    &["app", "http", "cli"],
];

#[test]
fn no_file_imports_a_layer_above_its_own() {
    let layer = |file: &str| {
        let top = module_path(file).into_iter().next();
        let top = top.as_deref().unwrap_or("");
        LAYERS
            .iter()
            .position(|modules| modules.contains(&top))
            .unwrap_or_else(|| panic!("{file}: the module is in no layer of LAYERS"))
    };
    let graph = import_graph();
    let mut upward = Vec::new();
    for (from, imports) in &graph {
        if from == "src/lib.rs" {
            continue;
        }
        for import in imports {
            if import.to != "src/lib.rs" && layer(&import.to) > layer(from) {
                upward.push(format!("{from}:{} imports {}", import.line, import.to));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_circle_between_files() {
    let graph = import_graph();
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import circles between files:\n{}",
        cycles.join("\n")
    );
}

/// The graph must see every kind of import, or an empty graph would pass the tests above.
#[test]
fn the_import_graph_sees_crate_super_and_re_export_paths() {
    let graph = import_graph();
    let has = |from: &str, to: &str| graph[from].iter().any(|import| import.to == to);
    // `use crate::kafka::{HistoryConsumer, …}`, through kafka's mod.rs.
    assert!(has("src/actors/supervisor.rs", "src/kafka/mod.rs"));
    // `use super::dispatcher::Dispatcher;`
    assert!(has("src/actors/committer.rs", "src/actors/dispatcher.rs"));
    // `pub use pipeline::Pipeline;` in a mod.rs.
    assert!(has("src/actors/mod.rs", "src/actors/pipeline.rs"));
    // `crate::metrics::register_families()` in a function body.
    assert!(has("src/app.rs", "src/metrics.rs"));
    // `use super::*;` in a file's test module stays in the file.
    assert!(
        !has("src/kafka/intake.rs", "src/kafka/mod.rs"),
        "{:?}",
        graph["src/kafka/intake.rs"]
    );
}

/// One import of a file: the file it reaches, and the line that says so.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    to: String,
    line: usize,
}

type Graph = std::collections::BTreeMap<String, Vec<Import>>;

/// `src/kafka/context.rs` defines `kafka::context`, `src/kafka/mod.rs` defines `kafka`.
fn module_path(file: &str) -> Vec<String> {
    let relative = file.strip_prefix("src/").expect("a file under src/");
    let relative = relative.strip_suffix(".rs").expect("a Rust file");
    let mut path: Vec<String> = relative.split('/').map(str::to_owned).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// Which file of the crate imports which: every `use crate::…`, `use super::…`, `use self::…`,
/// `use child::…` of a declared child module, and such paths written out in code. A path is
/// mapped to the file of its longest module prefix, so `crate::store::PgPool` is an import of
/// `src/store/mod.rs` (the re-export), `crate::store::pool::PgPool` one of `src/store/pool.rs`.
fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<String> = sources("")
        .iter()
        .map(|file| {
            let relative = file.strip_prefix(&src).unwrap().to_string_lossy();
            format!("src/{}", relative.replace('\\', "/"))
        })
        // The binary is a crate of its own, importing the library by name.
        .filter(|file| file != "src/main.rs")
        .collect();
    files.sort();
    let modules: std::collections::HashMap<Vec<String>, String> = files
        .iter()
        .map(|file| (module_path(file), file.clone()))
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file.strip_prefix("src/").unwrap())).unwrap();
        let mut imports: Vec<Import> = paths_in(file, &text)
            .into_iter()
            .filter_map(|(line, path)| {
                let found = (1..=path.len())
                    .rev()
                    .find_map(|len| modules.get(&path[..len]))?;
                (found != file).then(|| Import {
                    to: found.clone(),
                    line,
                })
            })
            .collect();
        imports.sort();
        imports.dedup_by(|a, b| a.to == b.to);
        graph.insert(file.clone(), imports);
    }
    graph
}

/// The crate-absolute module paths a file names, with their line numbers.
fn paths_in(file: &str, text: &str) -> Vec<(usize, Vec<String>)> {
    let module = module_path(file);
    let children: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let line = code_of(line);
            let declared = line
                .strip_prefix("pub ")
                .or_else(|| line.strip_prefix("pub(crate) "))
                .unwrap_or(line.as_str())
                .strip_prefix("mod ")?
                .strip_suffix(';')?
                .to_owned();
            Some(declared)
        })
        .collect();
    let mut found = Vec::new();
    // Inline modules (`mod tests {`) open and close at the same indentation (rustfmt).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut statement: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let code = code_of(raw);
        let indent = raw.len() - raw.trim_start().len();
        let trimmed = code.trim();
        if trimmed == "}" && inline.last().is_some_and(|(_, at)| *at == indent) {
            inline.pop();
            continue;
        }
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect();
        let absolute = |segments: &[String]| -> Option<Vec<String>> {
            let (first, rest) = segments.split_first()?;
            let mut path = match first.as_str() {
                "crate" => Vec::new(),
                "self" => here.clone(),
                "super" => {
                    let supers = segments.iter().take_while(|s| *s == "super").count();
                    let mut path = here.clone();
                    for _ in 0..supers {
                        path.pop()?;
                    }
                    path.extend(segments[supers..].iter().cloned());
                    return Some(path);
                }
                child if inline.is_empty() && children.iter().any(|c| c == child) => {
                    let mut path = module.clone();
                    path.push(child.to_owned());
                    path
                }
                _ => return None,
            };
            path.extend(rest.iter().cloned());
            Some(path)
        };
        let opened = trimmed
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(" {"));
        if let Some(name) = opened {
            inline.push((name.to_owned(), indent));
            continue;
        }
        let starts_use = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|prefix| trimmed.strip_prefix(prefix));
        match (&mut statement, starts_use) {
            (Some((_, text)), _) => text.push_str(trimmed),
            (None, Some(rest)) => statement = Some((number, rest.to_owned())),
            (None, None) => {
                for path in paths_written_out(&code) {
                    if let Some(path) = absolute(&path) {
                        found.push((number, path));
                    }
                }
            }
        }
        if let Some((line, text)) = statement.take_if(|(_, text)| text.ends_with(';')) {
            for path in use_tree(&[], text.trim_end_matches(';')) {
                if let Some(path) = absolute(&path) {
                    found.push((line, path));
                }
            }
        }
    }
    found
}

/// A line without its comment and with its string literals blanked.
fn code_of(line: &str) -> String {
    let mut code = String::new();
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_string => {
                chars.next();
            }
            '"' => {
                in_string = !in_string;
                code.push('"');
            }
            '\'' if !in_string && chars.peek() == Some(&'"') => {
                // The character literal '"'.
                chars.next();
                code.push_str("' '");
                chars.next();
            }
            '/' if !in_string && chars.peek() == Some(&'/') => break,
            _ if in_string => code.push(' '),
            _ => code.push(c),
        }
    }
    code.trim_end().to_owned()
}

/// The paths of a `use` tree (`crate::a::{b, c::{self, D}}`), expanded; `self` names its
/// parent, a glob or a renaming ends its path.
fn use_tree(prefix: &[String], tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    let mut path = prefix.to_vec();
    let mut rest = tree;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.strip_suffix('}').expect("a closed use group");
            let mut paths = Vec::new();
            let (mut depth, mut start) = (0, 0);
            for (at, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths.extend(use_tree(&path, &group[start..at]));
                        start = at + 1;
                    }
                    _ => {}
                }
            }
            if !group[start..].trim().is_empty() {
                paths.extend(use_tree(&path, &group[start..]));
            }
            return paths;
        }
        let (segment, next) = match rest.split_once("::") {
            Some((segment, next)) => (segment, Some(next)),
            None => (rest, None),
        };
        let segment = segment.split(" as ").next().unwrap().trim();
        if !matches!(segment, "self" | "*" | "") || path.is_empty() {
            path.push(segment.to_owned());
        }
        match next {
            Some(next) => rest = next.trim(),
            None => return vec![path],
        }
    }
}

/// Paths like `crate::metrics::register_families` written in code, split into segments.
fn paths_written_out(code: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut at = 0;
    while at < bytes.len() {
        let starts = is_ident(bytes[at])
            && (at == 0 || !(is_ident(bytes[at - 1]) || matches!(bytes[at - 1], ':' | '$')));
        if !starts {
            at += 1;
            continue;
        }
        let mut segments = Vec::new();
        loop {
            let start = at;
            while at < bytes.len() && is_ident(bytes[at]) {
                at += 1;
            }
            segments.push(bytes[start..at].iter().collect::<String>());
            let more = bytes.get(at) == Some(&':')
                && bytes.get(at + 1) == Some(&':')
                && bytes.get(at + 2).is_some_and(|c| is_ident(*c));
            if !more {
                break;
            }
            at += 2;
        }
        if segments.len() > 1 {
            paths.push(segments);
        }
    }
    paths
}

/// Every circle the depth-first search closes, as `a.rs:LINE → b.rs:LINE → a.rs`.
fn cycles(graph: &Graph) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit<'g>(
        file: &'g str,
        graph: &'g Graph,
        marks: &mut std::collections::HashMap<&'g str, Mark>,
        stack: &mut Vec<(&'g str, usize)>,
        found: &mut Vec<String>,
    ) {
        marks.insert(file, Mark::Open);
        for import in &graph[file] {
            stack.push((file, import.line));
            match marks.get(import.to.as_str()).copied().unwrap_or(Mark::New) {
                Mark::New => visit(&import.to, graph, marks, stack, found),
                Mark::Open => {
                    let start = stack
                        .iter()
                        .position(|(from, _)| *from == import.to)
                        .unwrap();
                    let mut circle: Vec<String> = stack[start..]
                        .iter()
                        .map(|(from, line)| format!("{from}:{line}"))
                        .collect();
                    circle.push(import.to.clone());
                    found.push(circle.join(" → "));
                }
                Mark::Done => {}
            }
            stack.pop();
        }
        marks.insert(file, Mark::Done);
    }
    let mut marks = std::collections::HashMap::new();
    let mut found = Vec::new();
    for file in graph.keys() {
        if marks.get(file.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            visit(file, graph, &mut marks, &mut Vec::new(), &mut found);
        }
    }
    found
}
