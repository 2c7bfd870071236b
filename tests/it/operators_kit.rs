//! The operators' kit: the alert rules (promtool's checks and unit tests, the PrometheusRule
//! copy), the Grafana dashboard against what a running service exports, and a real Prometheus
//! that scrapes a running service and raises an alert when writes fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use history_devkit::probe::get as http_get;
use history_devkit::process::Process;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, WorkloadSpec};
use history_service::metrics as names;
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;

const ALERTS: &str = "deploy/prometheus/alerts.yaml";
const ALERTS_TEST: &str = "deploy/prometheus/alerts_test.yaml";
const PROMETHEUS_RULE: &str = "deploy/kubernetes/monitoring/prometheusrule.yaml";
const DASHBOARD: &str = "deploy/grafana/history-service.json";

/// Every family the service declares (some are implemented on other branches).
const DECLARED: [&str; 35] = [
    names::EVENTS_TOTAL,
    names::DEAD_LETTERS_TOTAL,
    names::CONFLICTING_DUPLICATES_TOTAL,
    names::DEAD_LETTER_CONFLICTS_TOTAL,
    names::RECORDS_FETCHED_TOTAL,
    names::TRANSACTION_SECONDS,
    names::BATCH_EVENTS,
    names::RETRIES_TOTAL,
    names::REBALANCES_TOTAL,
    names::COMMITS_TOTAL,
    names::COMMITTED_OFFSET,
    names::CONSUMER_LAG,
    names::IN_FLIGHT,
    names::ASSIGNED_PARTITIONS,
    names::PARTITION_PAUSES_TOTAL,
    names::OFFSET_RESETS_TOTAL,
    names::OFFSET_RESET_SKIPPED_RECORDS_TOTAL,
    names::STUCK_EVENT,
    names::DEAD_LETTER_PUBLISH_FAILURES_TOTAL,
    names::READY,
    names::WINDOW_LIMIT,
    names::KAFKA_CLIENT_ERRORS_TOTAL,
    names::DB_TIMEOUTS_TOTAL,
    names::GROUP_PROTOCOL_INFO,
    names::TOPIC_MISSING,
    names::UNDECODABLE_BATCH,
    names::KAFKA_UNREACHABLE,
    names::KAFKA_BROKERS,
    names::FETCH_SIZED_BROKERS,
    names::FETCH_COMPRESSION_RATIO,
    names::FETCH_COMPRESSION_RATIO_LIMIT,
    names::KAFKA_CLIENT_HEAP_BYTES,
    names::KAFKA_CLIENT_HEAP_LIMIT,
    names::OFFSET_REWINDS_TOTAL,
    names::DATABASE_BEHIND,
];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// A Prometheus tool from Debian's `prometheus` package. Missing, the test fails: it never
/// passes without checking (scripts/test.sh installs the package).
fn prometheus_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: scripts/test.sh installs Debian's `prometheus` \
                 package (scripts/test-tools.sh)"
            )
        })
}

/// The `history_…` names a text mentions (metric names in PromQL, in a dashboard, …).
fn history_names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut rest = text;
    while let Some(at) = rest.find("history_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if !before.is_some_and(is_name) {
            found.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    found
}

fn promtool(promtool: &Path, args: &[&str]) {
    let output = Command::new(promtool)
        .args(args)
        .current_dir(repo("."))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    assert!(text.contains("SUCCESS"), "promtool {args:?}:\n{text}");
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    let binary = prometheus_tool("promtool");
    promtool(&binary, &["check", "rules", ALERTS]);
    promtool(&binary, &["test", "rules", ALERTS_TEST]);
    // The Kubernetes copy, as the Prometheus Operator would hand it to Prometheus.
    let manifest: Yaml = serde_yaml_ng::from_str(&read(PROMETHEUS_RULE)).unwrap();
    let extracted = std::env::temp_dir().join(format!(
        "history-prometheusrule-{:016x}.yaml",
        rand::random::<u64>()
    ));
    std::fs::write(
        &extracted,
        serde_yaml_ng::to_string(&manifest["spec"]).unwrap(),
    )
    .unwrap();
    promtool(&binary, &["check", "rules", extracted.to_str().unwrap()]);
    let _ = std::fs::remove_file(extracted);
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn the_alert_rules_cover_the_readme_list_and_the_prometheus_rule_carries_the_same() {
    let alerts: Yaml = serde_yaml_ng::from_str(&read(ALERTS)).unwrap();
    let manifest: Yaml = serde_yaml_ng::from_str(&read(PROMETHEUS_RULE)).unwrap();
    assert_eq!(manifest["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(
        manifest["spec"], alerts,
        "{PROMETHEUS_RULE} must carry exactly the groups of {ALERTS}"
    );

    let readme_anchors: BTreeSet<String> = read("README.md")
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect();
    let mut alert_names = BTreeSet::new();
    let mut used = BTreeSet::new();
    for rule in alerts["groups"][0]["rules"].as_sequence().unwrap() {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        alert_names.insert(name.to_owned());
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            let text = rule["annotations"][key].as_str().unwrap_or_default();
            assert!(!text.trim().is_empty(), "{name}: no {key}");
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
        let section = runbook
            .strip_prefix("README.md#")
            .unwrap_or_else(|| panic!("{name}: runbook_url {runbook:?} is not a README section"));
        assert!(
            readme_anchors.contains(section),
            "{name}: README has no section #{section}"
        );
        used.extend(history_names(rule["expr"].as_str().unwrap()));
    }
    // What the README tells operators to alert on, and the families this round added.
    for required in [
        "HistoryConsumerLagGrowing",
        "HistoryWritesRetrying",
        "HistoryEventStuck",
        "HistoryPartitionWindowFull",
        "HistoryDeadLetters",
        "HistoryConflictingDuplicates",
        "HistoryDeadLetterConflicts",
        "HistoryOffsetReset",
        "HistoryDeadLetterPublishFailing",
        "HistoryNotReady",
        "HistoryRebalancesNotSettling",
        "HistoryNoRecordsFetched",
        "HistoryKafkaClientErrors",
        "HistoryDatabaseHangs",
        "HistoryTopicMissing",
        "HistoryKafkaUnreachable",
        "HistoryRecordsUndecodable",
        "HistoryFetchSizingExceeded",
        "HistoryOffsetRewound",
        "HistoryDatabaseBehindKafka",
        "HistoryPartitionWaiting",
    ] {
        assert!(alert_names.contains(required), "no alert {required}");
    }
    let declared: BTreeSet<String> = DECLARED.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<_> = used.difference(&declared).collect();
    assert!(
        unknown.is_empty(),
        "alerts use names the service does not declare: {unknown:?}"
    );
}

#[test]
fn the_keda_scaled_object_scales_the_deployment_on_the_services_group_and_topic() {
    let yaml = |path: &str| -> Yaml { serde_yaml_ng::from_str(&read(path)).unwrap() };
    let scaled = yaml("deploy/kubernetes/monitoring/keda-scaledobject.yaml");
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let configmap = yaml("deploy/kubernetes/configmap.yaml");
    assert_eq!(scaled["kind"].as_str(), Some("ScaledObject"));
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );

    // The service's settings as the ConfigMap gives them (and validated as the service would).
    let file = std::env::temp_dir().join(format!("history-cm-{:016x}.toml", rand::random::<u64>()));
    std::fs::write(&file, configmap["data"]["history.toml"].as_str().unwrap()).unwrap();
    let settings =
        history_service::config::Settings::load_from(Some(&file), Some(Default::default()));
    let _ = std::fs::remove_file(&file);
    let kafka = settings
        .expect("the ConfigMap is a valid configuration")
        .kafka;

    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("kafka"));
    let metadata = &trigger["metadata"];
    assert_eq!(
        metadata["bootstrapServers"].as_str(),
        Some(kafka.brokers.as_str())
    );
    assert_eq!(
        metadata["consumerGroup"].as_str(),
        Some(kafka.group_id.as_str())
    );
    assert_eq!(kafka.topics.len(), 1, "one trigger per topic");
    assert_eq!(metadata["topic"].as_str(), Some(kafka.topics[0].as_str()));
    // Replicas beyond the partition count would sit idle: KEDA must not add them.
    assert_eq!(metadata["allowIdleConsumers"].as_str(), Some("false"));
    assert_eq!(metadata["offsetResetPolicy"].as_str(), Some("earliest"));
    let (min, max) = (
        scaled["spec"]["minReplicaCount"].as_u64().unwrap(),
        scaled["spec"]["maxReplicaCount"].as_u64().unwrap(),
    );
    assert!(1 <= min && min <= max, "replicas {min}..={max}");

    let kustomization = yaml("deploy/kubernetes/monitoring/kustomization.yaml");
    for resource in kustomization["resources"].as_sequence().unwrap() {
        let path = format!(
            "deploy/kubernetes/monitoring/{}",
            resource.as_str().unwrap()
        );
        assert!(repo(&path).is_file(), "{path} is listed but missing");
    }
}

/// A service after a small workload (with poison, event ids starting with `prefix`) is fully
/// committed and the lag is reported; with the number of events it applied.
async fn running_service(prefix: &str) -> (TestApp, usize) {
    let app = TestApp::spawn(|o| {
        o.partitions = 3;
        o.env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "200");
    })
    .await;
    let records = workload::generate(&WorkloadSpec {
        records: 400,
        duplicates: 0.1,
        poison: 0.03,
        partitions: 3,
        id_prefix: format!("{prefix}-a"),
        tickets: 40,
        max_payload_bytes: 65536,
        seed: 14,
    });
    app.produce(&records).await;
    app.wait_committed(Duration::from_secs(60)).await;
    let applied = workload::distinct_events(&records);
    app.wait_for_metrics(Duration::from_secs(20), |m| {
        m.text().contains("history_consumer_lag{")
            && m.get("history_events_total{outcome=\"applied\"}") == Some(applied as f64)
    })
    .await;
    (app, applied)
}

/// GETs a path from a local server (Prometheus's API); `(0, "")` while nothing answers.
async fn get(port: u16, path: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(port, &path).unwrap_or((0, String::new())))
        .await
        .unwrap()
}

#[actix_rt::test]
async fn the_dashboard_parses_and_queries_only_families_the_service_exports() {
    let (app, _) = running_service("history-kit-dashboard").await;
    let metrics = app.metrics().await;
    let text = metrics.text();
    let exported = metrics.names();

    // Every family has its help text; counters known in advance exist before their first
    // event (so `increase()` sees it); the window limit is there to compare with.
    for family in history_names(text) {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| family.strip_suffix(suffix))
            .filter(|base| text.contains(&format!("# TYPE {base} histogram")))
            .unwrap_or(&family);
        assert!(
            text.contains(&format!("# HELP {base} ")),
            "no HELP for {base} in\n{text}"
        );
    }
    for zero in [
        "history_events_total{outcome=\"unknown\"} 0",
        "history_retries_total 0",
        "history_rebalances_total{kind=\"lost\"} 0",
        "history_offset_commits_total{reason=\"shutdown\",result=\"error\"} 0",
        "history_dead_letter_publish_failures_total 0",
        "history_conflicting_duplicates_total 0",
    ] {
        assert!(
            text.lines().any(|line| line == zero),
            "{zero:?} missing in\n{text}"
        );
    }
    assert_eq!(metrics.get(names::WINDOW_LIMIT), Some(20000.0), "{text}");

    let dashboard: Json = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
    let mut queries = Vec::new();
    collect_strings(&dashboard, &mut queries);
    let used: BTreeSet<String> = queries.iter().flat_map(|q| history_names(q)).collect();
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries names /metrics does not have: {missing:?}\nexported: {exported:?}"
    );
    // The series an operator needs to see on the dashboard.
    for shown in [
        "history_events_total",
        "history_consumer_lag",
        "history_in_flight",
        "history_transaction_seconds_bucket",
        "history_batch_events_bucket",
        "history_retries_total",
        "history_rebalances_total",
        "history_offset_commits_total",
        "history_dead_letters_total",
        "history_committed_offset",
        "history_partitions_in_turn",
        "history_partitions_in_fetch_order",
        "history_partitions_waiting_turn",
    ] {
        assert!(used.contains(shown), "the dashboard does not show {shown}");
    }
    drop(app);
}

fn collect_strings(value: &Json, out: &mut Vec<String>) {
    match value {
        Json::String(s) => out.push(s.clone()),
        Json::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Json::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// Debian's Prometheus server on a local port with a temporary database; killed, and its
/// directory removed, when dropped.
struct Prometheus {
    process: Process,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    fn start(binary: &Path, target_port: u16) -> Prometheus {
        let dir =
            std::env::temp_dir().join(format!("history-prometheus-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: history\n    static_configs:\n      \
             - targets: ['127.0.0.1:{target_port}']\n",
            rules = repo(ALERTS).display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // Prometheus binds its address itself (it takes no socket handed over): port 0, and the
        // port the OS chose read from its log line `msg="Listening on" address=127.0.0.1:PORT`.
        let mut process = Process::command(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .spawn()
            .expect("prometheus starts");
        let line = process
            .wait_for_line("msg=\"Listening on\"", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("Prometheus never listened:\n{}", process.logs()));
        let port = line
            .rsplit_once("address=127.0.0.1:")
            .and_then(|(_, port)| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Prometheus { process, dir, port }
    }

    fn log(&self) -> String {
        self.process.logs()
    }

    /// GETs an API path; the JSON answer's `data`, or None while Prometheus does not answer.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Option<Json> {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(query)
            .finish();
        let (status, body) = get(self.port, format!("{path}?{query}")).await;
        if status != 200 {
            return None;
        }
        let answer: Json = serde_json::from_str(&body).ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// Polls until `check` finds what it wants in the API's answers, within `timeout`.
    async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl AsyncFn(&Prometheus) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = check(self).await {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus: {what} not within {timeout:?}; its log:\n{}",
                self.log()
            );
            actix_rt::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The state of the alert named `name` (`pending` or `firing`), if it is active.
    async fn alert_state(&self, name: &str) -> Option<String> {
        let data = self.api("/api/v1/alerts", &[]).await?;
        data["alerts"]
            .as_array()?
            .iter()
            .find(|alert| alert["labels"]["alertname"] == name)
            .and_then(|alert| alert["state"].as_str().map(str::to_owned))
    }

    async fn value(&self, query: &str) -> Option<f64> {
        let data = self.api("/api/v1/query", &[("query", query)]).await?;
        data["result"].as_array()?.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Its log is printed by the process wrapper if a test failed.
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[actix_rt::test]
async fn a_real_prometheus_scrapes_the_service_and_raises_an_alert_when_writes_fail() {
    let binary = prometheus_tool("prometheus");
    let (app, applied_by_the_service) = running_service("history-kit-prometheus").await;
    let prometheus = Prometheus::start(&binary, app.port());
    let wait = Duration::from_secs(60);

    prometheus
        .wait_for("the service's target up", wait, async |p| {
            let data = p.api("/api/v1/targets", &[]).await?;
            let target = data["activeTargets"].as_array()?.first()?.clone();
            (target["health"] == "up").then_some(())
        })
        .await;
    let scraped = prometheus
        .wait_for("history_ series scraped", wait, async |p| {
            p.value("count({__name__=~\"history_.+\"})").await
        })
        .await;
    assert!(scraped >= 10.0, "{scraped} history_ series");
    let applied = prometheus
        .wait_for("applied events scraped", wait, async |p| {
            p.value("history_events_total{job=\"history\",outcome=\"applied\"}")
                .await
        })
        .await;
    assert_eq!(
        applied, applied_by_the_service as f64,
        "the service's own count"
    );
    let rules = prometheus
        .wait_for("the rule file loaded", wait, async |p| {
            let data = p.api("/api/v1/rules", &[]).await?;
            let groups = data["groups"].as_array()?;
            let rules = groups.first()?["rules"].as_array()?.len();
            (rules > 0).then_some(rules)
        })
        .await;
    assert!(rules >= 10, "{rules} rules loaded");
    // Nothing has failed yet, so the alert is quiet (unless a write happened to be retried).
    if prometheus.value("sum(history_retries_total)").await == Some(0.0) {
        assert_eq!(prometheus.alert_state("HistoryWritesRetrying").await, None);
    }

    // Every write now fails: the database rejects any new history row.
    app.db
        .client()
        .await
        .batch_execute("ALTER TABLE history_events ADD CONSTRAINT no_rows CHECK (false) NOT VALID")
        .await
        .unwrap();
    let more = workload::generate(&WorkloadSpec {
        records: 30,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 3,
        id_prefix: "kit-rejected".into(),
        tickets: 10,
        max_payload_bytes: 65536,
        seed: 15,
    });
    app.produce(&more).await;
    let state = prometheus
        .wait_for("HistoryWritesRetrying pending or firing", wait, async |p| {
            p.alert_state("HistoryWritesRetrying").await
        })
        .await;
    assert!(
        state == "pending" || state == "firing",
        "HistoryWritesRetrying is {state}"
    );
    let retries = prometheus
        .value("sum(history_retries_total)")
        .await
        .unwrap_or_default();
    assert!(retries > 0.0, "retries scraped: {retries}");
    drop(prometheus);
    drop(app);
}

/// The StatefulSet runs exactly the Deployment's pods (so the two cannot drift apart), each
/// under its stable pod name as its static group member id, governed by a headless Service that
/// selects them.
#[test]
fn the_stateful_set_runs_the_deployments_pods_under_stable_member_ids() {
    let documents: Vec<Yaml> =
        serde_yaml_ng::Deserializer::from_str(&read("deploy/kubernetes/statefulset.yaml"))
            .map(|document| serde::Deserialize::deserialize(document).unwrap())
            .collect();
    let deployment: Yaml =
        serde_yaml_ng::from_str(&read("deploy/kubernetes/deployment.yaml")).unwrap();
    let kind = |kind: &str| {
        documents
            .iter()
            .find(|document| document["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} in statefulset.yaml"))
    };
    let (set, service) = (kind("StatefulSet"), kind("Service"));
    assert_eq!(set["spec"]["template"], deployment["spec"]["template"]);
    assert_eq!(set["spec"]["selector"], deployment["spec"]["selector"]);
    assert_eq!(set["metadata"]["name"], deployment["metadata"]["name"]);
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(
        service["spec"]["selector"],
        set["spec"]["selector"]["matchLabels"]
    );
    let env = set["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let instance_id = env
        .iter()
        .find(|var| var["name"].as_str() == Some("HISTORY__KAFKA__GROUP_INSTANCE_ID"))
        .expect("the pods are static members");
    assert_eq!(
        instance_id["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    // Listed beside the Deployment as its alternative, not applied with it.
    let kustomization = read("deploy/kubernetes/kustomization.yaml");
    assert!(kustomization.contains("statefulset.yaml"));
    let applied: Yaml = serde_yaml_ng::from_str(&kustomization).unwrap();
    let resources = applied["resources"].as_sequence().unwrap();
    assert!(
        resources
            .iter()
            .any(|r| r.as_str() == Some("deployment.yaml"))
    );
    assert!(
        !resources
            .iter()
            .any(|r| r.as_str() == Some("statefulset.yaml"))
    );
}
