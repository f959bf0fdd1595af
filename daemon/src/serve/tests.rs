//! Unit tests of the server: job terms, attach checks, the registry, socket permissions.

use std::sync::Arc;

use stoker_wire::protocol::{Attach, ErrorCode};
use stoker_wire::spec::PipelineSpec;

use super::access::Peer;
use super::connection::check_attach;
use super::listen::set_socket_permissions;
use super::registry::{JobTerms, Registry};
use super::ServerError;

fn attach() -> Attach {
    Attach {
        job: "j".into(),
        rank: 0,
        world_size: 2,
        device: stoker_wire::Device::Cpu,
        spec: PipelineSpec::train(4, 16),
        dataset: "/data".into(),
        seed: 7,
        start: Default::default(),
        offset: None,
    }
}

#[test]
fn terms_mismatch_names_the_field() {
    let a = JobTerms::of(&attach());
    assert_eq!(a.mismatch(&a.clone()), None);
    let mut b = attach();
    b.world_size = 4;
    assert!(a
        .mismatch(&JobTerms::of(&b))
        .unwrap()
        .contains("world_size 4"));
    let mut b = attach();
    b.seed = 8;
    assert!(a.mismatch(&JobTerms::of(&b)).unwrap().contains("seed 8"));
    let mut b = attach();
    b.dataset = "/other".into();
    assert!(a.mismatch(&JobTerms::of(&b)).unwrap().contains("/other"));
    let mut b = attach();
    b.spec.drop_last = true;
    assert_eq!(
        a.mismatch(&JobTerms::of(&b)).unwrap(),
        "spec field drop_last differs from the job's"
    );
}

#[test]
fn attach_checks_refuse_with_codes() {
    let mut a = attach();
    a.rank = 2;
    assert_eq!(check_attach(&a).unwrap_err().code, ErrorCode::InvalidSpec);
    let mut a = attach();
    a.device = "cuda:1".parse().unwrap();
    let r = check_attach(&a).unwrap_err();
    assert_eq!(r.code, ErrorCode::UnsupportedDevice);
    assert!(r.message.contains("cuda:1"), "{}", r.message);
    let mut a = attach();
    a.spec.batch_size = 0;
    let r = check_attach(&a).unwrap_err();
    assert_eq!(r.code, ErrorCode::InvalidSpec);
    assert!(r.message.contains("batch_size"), "{}", r.message);
    check_attach(&attach()).unwrap();
}

#[test]
fn an_unopenable_dataset_is_refused_and_leaves_no_job() {
    let registry = Arc::new(Registry::default());
    let mut a = attach();
    a.dataset = "/nonexistent/stoker/dataset".into();
    let me = Peer {
        pid: 1,
        uid: rustix::process::geteuid().as_raw(),
        gid: 0,
        groups: Vec::new(),
    };
    let admitted = registry.access().admit(&me, &a.dataset).unwrap();
    let asker = stoker_pipeline::source::index::Asker::new(|| false);
    let r = (registry.seat(&a, &admitted, me.uid, &asker))
        .err()
        .expect("refused");
    assert_eq!(r.code, ErrorCode::UnknownDataset);
    assert!(registry.jobs.lock().unwrap().is_empty());
}

#[test]
fn a_created_socket_gets_the_configured_mode_and_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let _listener = stoker_wire::socket::SeqPacketListener::bind(&path).unwrap();
    // SAFETY: getegid has no preconditions and cannot fail.
    let gid = unsafe { libc::getegid() };
    set_socket_permissions(&path, &path, 0o640, Some(&gid.to_string())).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(meta.gid(), gid);
    let err =
        set_socket_permissions(&path, &path, 0o660, Some("no-such-group-stoker")).unwrap_err();
    assert!(err.is_config(), "{err}");
    assert!(err.to_string().contains("no-such-group-stoker"), "{err}");
}

#[test]
fn config_errors_are_told_apart() {
    assert!(ServerError::SocketGroup {
        path: "/x".into(),
        group: "g".into()
    }
    .is_config());
    assert!(!ServerError::InUse("/x".into()).is_config());
}
