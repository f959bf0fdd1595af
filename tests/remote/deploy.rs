//! The Kubernetes worker manifests hold a config stokerd accepts, and agree with themselves.

use super::*;

/// `deploy/kubernetes/workers.yaml`: its ConfigMap's stoker.toml loads with stokerd's own
/// parser, listens on the port the container and the headless Service name, and reads the
/// secret where the Secret is mounted. (scripts/k8s-validate checks the manifests against
/// the Kubernetes schemas.)
#[test]
fn the_kubernetes_worker_manifests_hold_a_valid_worker_config() {
    let (manifest, config) = stoker_testkit::manifest_config("workers.yaml", "[worker]");
    assert_eq!(config.worker.listen.as_deref(), Some("0.0.0.0:7411"));
    assert_eq!(config.access.dataset_roots, [PathBuf::from("/data")]);
    let secret = config.worker.secret_file.unwrap();
    assert!(manifest.contains(&format!(
        "mountPath: {}\n",
        secret.parent().unwrap().display()
    )));
    assert!(manifest.contains("containerPort: 7411\n"));
    assert!(manifest.contains("port: 7411\n"));
    assert!(manifest.contains("clusterIP: None\n"));
    assert!(manifest.contains("defaultMode: 0400\n"));
}

/// `deploy/kubernetes/workers-autoscale.yaml` scales the worker Deployment of workers.yaml on
/// an external metric its prometheus-adapter rule makes from the data-stall series stokerd
/// exports, and never to more pods than the home daemons' commented `[remote]` block keeps
/// connections for.
#[test]
fn the_worker_autoscaler_follows_the_data_stall_stokerd_exports() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let read = |f: &str| std::fs::read_to_string(deploy.join(f)).unwrap();
    let (autoscale, workers, configmap) = (
        read("workers-autoscale.yaml"),
        read("workers.yaml"),
        read("configmap.yaml"),
    );
    let value = |text: &str, key: &str| -> String {
        let line = text.lines().find(|l| l.trim_start().starts_with(key));
        let line = line.unwrap_or_else(|| panic!("no {key}"));
        line.trim_start()[key.len()..].trim().to_string()
    };
    let scaled =
        "scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: stoker-worker\n";
    assert!(
        autoscale.contains(scaled),
        "the autoscaler scales another target"
    );
    assert!(workers.contains("kind: Deployment\nmetadata:\n  name: stoker-worker\n"));
    let series = stoker_daemon::service::metrics::catalogue::CLIENT_WAIT_FRACTION;
    assert!(
        autoscale.contains(&format!("seriesQuery: '{{__name__=\"{series}\"}}'")),
        "the adapter rule does not read {series}"
    );
    let made = value(&autoscale, "as:");
    assert!(
        autoscale.contains(&format!("metric:\n          name: {made}\n")),
        "the autoscaler asks for another metric than the adapter's {made}"
    );
    let max: usize = value(&autoscale, "maxReplicas:").parse().unwrap();
    let connections: usize = value(&configmap, "# connections =").parse().unwrap();
    assert!(
        max <= connections,
        "maxReplicas {max} over the home daemons' remote.connections {connections}"
    );
}

/// Issue 43 item 6: the Kubernetes worker's readiness probe is `stoker status` on the socket
/// its ConfigMap asks for, run here against a worker started from that config: it passes and
/// leaves no refusal in the worker's log. (It was a tcpSocket probe on the units port: a
/// connection that never authenticates, logged and counted as a refusal every 10 s per pod.)
#[test]
fn the_kubernetes_worker_readiness_probe_is_status_on_its_socket() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let manifest = std::fs::read_to_string(deploy.join("workers.yaml")).unwrap();
    let probe = manifest
        .split("readinessProbe:")
        .nth(1)
        .expect("a readiness probe");
    let probe = &probe[..probe.find("livenessProbe:").unwrap_or(probe.len())];
    assert!(!probe.contains("tcpSocket"), "{probe}");
    let command = "[\"/usr/bin/stoker\", \"status\", \"--socket\", \"/run/stoker/stoker.sock\"]";
    assert!(probe.contains(command), "{probe}");
    assert!(manifest.contains("socket = \"/run/stoker/stoker.sock\"\n"));
    // The probe against a worker with that config (its socket, port and secret in temp
    // folders).
    let world = World::new();
    let (worker, log, _addr) = world.worker("probed");
    let status =
        std::process::Command::new(stoker_testkit::stokerd_path().with_file_name("stoker"))
            .args(["status", "--socket"])
            .arg(worker.socket())
            .output()
            .unwrap();
    assert!(status.status.success(), "{status:?}");
    let text = read_log(&log);
    assert!(!text.contains("refus"), "{text}");
}

/// Issue 43 item 6: the Kubernetes manifests bind /metrics to the pod's address (for the
/// scrape), so they ship a NetworkPolicy: port 9464 only from the monitoring namespace, a
/// worker's units port only from the home daemons' pods.
#[test]
fn the_kubernetes_metrics_and_units_ports_are_fenced_by_a_network_policy() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let policy = std::fs::read_to_string(deploy.join("networkpolicy.yaml"))
        .expect("deploy/kubernetes/networkpolicy.yaml");
    let docs: Vec<&str> = policy.split("\n---\n").collect();
    assert_eq!(
        docs.len(),
        2,
        "one policy for the daemons, one for the workers"
    );
    for (doc, component) in docs.iter().zip(["daemon", "worker"]) {
        assert!(doc.contains("kind: NetworkPolicy"), "{doc}");
        assert!(
            doc.contains(&format!(
                "app.kubernetes.io/component: {component}\n  policyTypes"
            )),
            "{doc}"
        );
        assert!(
            doc.contains("kubernetes.io/metadata.name: monitoring"),
            "{doc}"
        );
        assert!(doc.contains("port: 9464"), "{doc}");
    }
    let worker = docs[1];
    let units = worker
        .split("- from:")
        .nth(2)
        .expect("a rule for the units port");
    assert!(
        units.contains("app.kubernetes.io/component: daemon") && units.contains("port: 7411"),
        "{units}"
    );
}
