//! The Kubernetes worker manifests hold a config stokerd accepts, and agree with themselves.

use super::*;

/// `deploy/kubernetes/workers.yaml`: its ConfigMap's stoker.toml loads with stokerd's own
/// parser, listens on the port the container and the headless Service name, and reads the
/// secret where the Secret is mounted. (scripts/k8s-validate checks the manifests against
/// the Kubernetes schemas.)
#[test]
fn the_kubernetes_worker_manifests_hold_a_valid_worker_config() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let manifest = std::fs::read_to_string(deploy.join("workers.yaml")).unwrap();
    let toml: String = manifest
        .lines()
        .skip_while(|l| l.trim() != "stoker.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    assert!(toml.contains("[worker]"), "no stoker.toml block found");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("stoker.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = stoker_daemon::service::config::Config::load(&path).unwrap();
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
