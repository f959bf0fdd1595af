//! The wire format's unit and property tests.

use super::codec::{READY_BODY, RELEASE_BODY, STATS_BODY};
use super::*;
use crate::spec::PipelineSpec;
use proptest::prelude::*;

fn attach() -> Attach {
    Attach {
        job: "resnet50-run7".into(),
        rank: 3,
        world_size: 8,
        device: Device::Cpu,
        spec: PipelineSpec::train(256, 224),
        dataset: "/data/imagenet/train".into(),
        seed: 42,
        start: Position::at(2, 17),
        offset: None,
    }
}

fn all_messages() -> Vec<Message> {
    vec![
        Message::Attach(Box::new(attach())),
        Message::Attached(Attached {
            slots: 4,
            slot_bytes: 1 << 20,
            ring_bytes: 4 << 20,
            steps_per_epoch: 625,
            offset_epoch_steps: None,
            dataset_len: 1_281_167,
            classes: 1000,
            class_names: vec!["n01440764".into(), "ťench".into()],
            ranks_attached: 2,
            created_job: false,
            daemon_version: "0.1.0".into(),
            accepts_stats: true,
            ..Attached::default()
        }),
        Message::Attached(Attached {
            slots: 3,
            slot_bytes: 1 << 20,
            ring_bytes: 1 << 16,
            image_memory: ImageMemory::Device,
            image_ring_bytes: 4 << 20,
            ..Attached::default()
        }),
        Message::Ready(Ready {
            slot: 3,
            generation: u64::MAX - 1,
            epoch: 9,
            step: 1234,
            n: 256,
        }),
        Message::Release(Release {
            slot: 2,
            generation: 77,
        }),
        Message::Detach,
        Message::EndOfData,
        Message::Status,
        Message::StatusReply(Box::new(DaemonStatus {
            daemon_version: "0.1.0".into(),
            pid: 42,
            clients: 2,
            backend: "cpu".into(),
            jobs: vec![JobStatus {
                job: "j".into(),
                ranks: vec![0, 1],
                stalls: vec![RankStall {
                    rank: 1,
                    wait_fraction: 0.25,
                    wait_s: 1.0,
                    compute_s: 3.0,
                    batches: 40,
                }],
                ..JobStatus::default()
            }],
            ..DaemonStatus::default()
        })),
        Message::error(
            ErrorCode::SpecMismatch,
            "spec differs from the job's in dtype",
        ),
        Message::Stats(Stats {
            wait_ns: 1_500_000_000,
            compute_ns: u64::MAX,
            batches: 12,
        }),
        Message::BadSamples(BadSamples {
            count: 3,
            first: vec!["a/broken.jpg".into(), "train-000.tar:x/7.jpg".into()],
        }),
    ]
}

/// BAD_SAMPLES (protocol 4) in its JSON form; with no names the list is left out.
#[test]
fn bad_samples_read_as_written() {
    let m = Message::BadSamples(BadSamples {
        count: 2,
        first: vec!["a/broken.jpg".into()],
    });
    let bytes = m.encode().unwrap();
    assert_eq!(&bytes[..HEADER_BYTES], b"SK\x04\x00\x0b\x00\x00\x00");
    assert_eq!(
        &bytes[HEADER_BYTES..],
        br#"{"count":2,"first":["a/broken.jpg"]}"#
    );
    assert_eq!(Message::decode(&bytes).unwrap(), m);
    let mut bare = bytes[..HEADER_BYTES].to_vec();
    bare.extend_from_slice(br#"{"count":1}"#);
    let read = Message::decode(&bare).unwrap();
    assert_eq!(
        read,
        Message::BadSamples(BadSamples {
            count: 1,
            first: vec![]
        })
    );
}

#[test]
fn a_host_ring_attached_keeps_the_old_wire_form() {
    let host = Attached {
        slots: 2,
        slot_bytes: 512,
        ring_bytes: 4096,
        daemon_version: "x".into(),
        ..Attached::default()
    };
    let bytes = Message::Attached(host.clone()).encode().unwrap();
    let json = std::str::from_utf8(&bytes[HEADER_BYTES..]).unwrap();
    assert!(
        !json.contains("image_memory") && !json.contains("image_ring_bytes"),
        "{json}"
    );
    // A message without the fields (every daemon before them) reads as host images.
    let old = r#"{"slots":2,"slot_bytes":512,"ring_bytes":4096,"steps_per_epoch":0,
        "dataset_len":0,"classes":0,"ranks_attached":0,"created_job":false,
        "daemon_version":"x"}"#;
    let parsed: Attached = serde_json::from_str(old).unwrap();
    assert_eq!(parsed, host);
    assert_eq!(parsed.image_memory, ImageMemory::Host);
    // Device images are named on the wire.
    let device = Attached {
        image_memory: ImageMemory::Device,
        image_ring_bytes: 2 << 20,
        ..host
    };
    let bytes = Message::Attached(device).encode().unwrap();
    let json = std::str::from_utf8(&bytes[HEADER_BYTES..]).unwrap();
    assert!(json.contains(r#""image_memory":"device""#), "{json}");
}

#[test]
fn every_message_round_trips() {
    for m in all_messages() {
        let bytes = m.encode().unwrap();
        assert_eq!(&bytes[..2], b"SK");
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), m.kind() as u16);
        assert_eq!(Message::decode(&bytes).unwrap(), m, "{:?}", m.kind());
    }
}

#[test]
fn both_start_position_forms_are_understood() {
    // The forms clients sent before elastic offsets existed (and before `start` did) still
    // decode, as no offset.
    let encoded = Message::Attach(Box::new(attach())).encode().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&encoded[HEADER_BYTES..]).unwrap();
    assert_eq!(json["start"], serde_json::json!({"epoch": 2, "step": 17}));
    let decode = |json: &serde_json::Value| {
        let mut bytes = b"SK\x04\x00\x01\x00\x00\x00".to_vec();
        bytes.extend(serde_json::to_vec(json).unwrap());
        let Message::Attach(a) = Message::decode(&bytes).unwrap() else {
            panic!("not an attach")
        };
        a
    };
    json["start"] = serde_json::json!({"epoch": 4, "step": 1});
    let a = decode(&json);
    assert_eq!((a.start, a.offset), (Position::at(4, 1), None));
    json.as_object_mut().unwrap().remove("start");
    let a = decode(&json);
    assert_eq!((a.start, a.offset), (Position::default(), None));
    // The elastic form round-trips, and so does the answer that goes with it.
    let mut a = attach();
    (a.start, a.offset) = EpochOffset {
        epoch: 3,
        consumed: 5120,
    }
    .resume();
    let m = Message::Attach(Box::new(a));
    assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    let answer = Attached {
        slots: 2,
        slot_bytes: 64,
        ring_bytes: 4096,
        steps_per_epoch: 10,
        offset_epoch_steps: Some(3),
        dataset_len: 80,
        classes: 2,
        ranks_attached: 1,
        created_job: true,
        daemon_version: "0.1.0".into(),
        accepts_stats: true,
        ..Attached::default()
    };
    let m = Message::Attached(answer);
    assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    // Unknown fields inside `start` are refused like anywhere else.
    json["start"] = serde_json::json!({"epoch": 4, "step": 1, "offest": null});
    let mut bytes = b"SK\x04\x00\x01\x00\x00\x00".to_vec();
    bytes.extend(serde_json::to_vec(&json).unwrap());
    let e = Message::decode(&bytes).unwrap_err();
    assert!(e.to_string().contains("offest"), "{e}");
}

#[test]
fn hot_messages_have_fixed_sizes() {
    let ready = Message::Ready(Ready {
        slot: 0,
        generation: 0,
        epoch: 0,
        step: 0,
        n: 0,
    });
    assert_eq!(ready.encode().unwrap().len(), HEADER_BYTES + READY_BODY);
    let release = Message::Release(Release {
        slot: 0,
        generation: 0,
    });
    assert_eq!(release.encode().unwrap().len(), HEADER_BYTES + RELEASE_BODY);
    let stats = Message::Stats(Stats::default());
    assert_eq!(stats.encode().unwrap().len(), HEADER_BYTES + STATS_BODY);
}

#[test]
fn an_attached_without_accepts_stats_decodes_as_not_accepting() {
    // A daemon from before STATS sends no `accepts_stats`.
    let json = br#"{"slots":4,"slot_bytes":1,"ring_bytes":4,"steps_per_epoch":1,"dataset_len":1,"classes":0,"ranks_attached":1,"created_job":true,"daemon_version":"0.0.9"}"#;
    let mut bytes = b"SK\x04\x00\x02\x00\x00\x00".to_vec();
    bytes.extend_from_slice(json);
    let Message::Attached(a) = Message::decode(&bytes).unwrap() else {
        panic!("expected ATTACHED")
    };
    assert!(!a.accepts_stats);
}

#[test]
fn a_wrong_version_is_reported_as_such() {
    let mut bytes = Message::Detach.encode().unwrap();
    bytes[2] = 9;
    let err = Message::decode(&bytes).unwrap_err();
    assert_eq!(
        err,
        DecodeError::Version {
            got: 9,
            peer_version: None
        }
    );
    assert_eq!(err.code(), ErrorCode::VersionMismatch);
}

#[test]
fn a_message_of_another_version_still_names_its_senders_version() {
    let mut bytes = Message::Attach(Box::new(attach())).encode().unwrap();
    bytes[2..4].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    assert_eq!(
        Message::decode(&bytes).unwrap_err(),
        DecodeError::Version {
            got: PROTOCOL_VERSION + 1,
            peer_version: Some(VERSION.to_owned()),
        }
    );
}

#[test]
fn an_error_encoded_for_another_protocol_version_reads_there() {
    let e = ErrorMessage {
        code: ErrorCode::VersionMismatch,
        message: "upgrade".into(),
    };
    let bytes = e.encode_in_protocol(1).unwrap();
    assert_eq!(&bytes[..4], b"SK\x01\x00");
    assert_eq!(bytes[HEADER_BYTES..HEADER_BYTES + 2], [2, 0]);
    assert_eq!(&bytes[HEADER_BYTES + 2..], b"upgrade");
}

#[test]
fn the_version_line_names_this_protocol_version() {
    assert_eq!(
        VERSION_LINE,
        format!("{VERSION} (protocol {PROTOCOL_VERSION})")
    );
    // A real version: the crate's, with the commit where git was there at build time.
    assert!(VERSION.starts_with(char::is_numeric), "{VERSION}");
    assert!(!VERSION.contains('/'), "a path in the version: {VERSION}");
}

/// Built inside this repository's git work tree, the version names the commit (the build
/// script once looked for the workspace one folder above ipc/wire, found none, and gave the
/// bare crate version).
#[test]
fn a_build_in_the_work_tree_names_its_commit() {
    let top = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !top.join(".git").exists() || env!("STOKER_VERSION_SOURCE") == "env" {
        return;
    }
    assert_eq!(
        env!("STOKER_VERSION_SOURCE"),
        "git",
        "no commit in {VERSION}"
    );
}

#[test]
fn a_mismatch_says_which_side_to_upgrade_with_both_versions() {
    let old = Speaker {
        protocol: 1,
        version: None,
    };
    let new = Speaker {
        protocol: 2,
        version: Some("0.2.0-3-gabc".into()),
    };
    let daemon_older = VersionMismatch {
        client: new.clone(),
        daemon: old.clone(),
    }
    .to_string();
    assert!(daemon_older.contains("upgrade the daemon (stokerd) to 0.2.0-3-gabc or later"));
    assert!(daemon_older.contains("client stoker 0.2.0-3-gabc, protocol 2"));
    assert!(
        daemon_older.contains("daemon stokerd of a version that does not report it, protocol 1")
    );
    let client_older = VersionMismatch {
        client: old,
        daemon: new,
    }
    .to_string();
    assert!(
        client_older.contains("upgrade the client"),
        "{client_older}"
    );
    assert!(
        client_older.contains("to 0.2.0-3-gabc or later"),
        "{client_older}"
    );
}

#[test]
fn malformed_messages_say_what_is_wrong() {
    assert_eq!(Message::decode(b"SK"), Err(DecodeError::Short(2)));
    assert_eq!(
        Message::decode(b"XX\x01\x00\x05\x00\x00\x00"),
        Err(DecodeError::Magic(*b"XX"))
    );
    assert_eq!(
        Message::decode(b"SK\x04\x00\x63\x00\x00\x00"),
        Err(DecodeError::UnknownType(0x63))
    );
    assert_eq!(
        Message::decode(b"SK\x04\x00\x05\x00\x01\x00"),
        Err(DecodeError::Reserved(1))
    );
    // Trailing bytes after a fixed body.
    let mut bytes = Message::Detach.encode().unwrap();
    bytes.push(0);
    assert!(matches!(
        Message::decode(&bytes),
        Err(DecodeError::BodyLength {
            got: 1,
            want: 0,
            ..
        })
    ));
    // Unknown JSON field in an attach.
    let encoded = Message::Attach(Box::new(attach())).encode().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&encoded[HEADER_BYTES..]).unwrap();
    json["colour"] = 1.into();
    let mut bytes = b"SK\x04\x00\x01\x00\x00\x00".to_vec();
    bytes.extend(serde_json::to_vec(&json).unwrap());
    let err = Message::decode(&bytes).unwrap_err();
    assert!(err.to_string().contains("colour"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("client stoker {VERSION}")),
        "{err}"
    );
    let big = vec![0u8; MAX_MESSAGE_BYTES + 1];
    assert_eq!(
        Message::decode(&big),
        Err(DecodeError::TooLong(MAX_MESSAGE_BYTES + 1))
    );
}

#[test]
fn oversize_messages_are_not_encoded_and_error_text_is_cut() {
    let mut a = attach();
    a.dataset = "x".repeat(MAX_MESSAGE_BYTES);
    assert!(matches!(
        Message::Attach(Box::new(a)).encode(),
        Err(EncodeError::TooLong(_))
    ));
    let Message::Error(e) = Message::error(ErrorCode::Internal, "é".repeat(MAX_ERROR_TEXT)) else {
        unreachable!()
    };
    assert!(e.message.len() <= MAX_ERROR_TEXT);
    assert!(e.message.chars().all(|c| c == 'é'));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Message::decode(&bytes);
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic(
        ty in 0u16..12,
        body in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut bytes = b"SK\x04\x00".to_vec();
        bytes.extend(ty.to_le_bytes());
        bytes.extend([0, 0]);
        bytes.extend(body);
        if let Ok(m) = Message::decode(&bytes) {
            // Whatever decodes re-encodes to a message that decodes the same.
            prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        which in 0usize..12,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = all_messages()[which].encode().unwrap();
        for (at, x) in flips {
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = Message::decode(&bytes);
    }

    #[test]
    fn ready_round_trips(slot: u32, generation: u64, epoch: u64, step: u64, n: u32) {
        let m = Message::Ready(Ready { slot, generation, epoch, step, n });
        prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    }
}

/// The ATTACH body every client of this protocol version sends (the Rust client, the C ABI,
/// the Python package through it): its JSON must stay byte for byte what it is for as long
/// as [`PROTOCOL_VERSION`] stays 4. Changing it means a new protocol version: bump
/// [`PROTOCOL_VERSION`] and this test's header with it (docs/protocol.md says why).
fn golden_attach_json(device: &str, start: &str) -> String {
    let spec = serde_json::to_string(&PipelineSpec::train(256, 224)).unwrap();
    format!(
        r#"{{"job":"resnet50-run7","rank":3,"world_size":8,"device":"{device}","spec":{spec},"dataset":"/data/imagenet/train","seed":42,"start":{start},"client_version":"{VERSION}"}}"#
    )
}

#[test]
fn attach_json_is_byte_identical_to_the_golden_form() {
    let header = b"SK\x04\x00\x01\x00\x00\x00";
    assert_eq!(
        PROTOCOL_VERSION, 4,
        "a new protocol version has new golden forms"
    );
    let uuid = "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
    let plain = golden_attach_json("cpu", r#"{"epoch":2,"step":17}"#);
    let elastic = golden_attach_json(
        uuid,
        r#"{"epoch":3,"step":0,"offset":{"epoch":3,"consumed":5120}}"#,
    );
    let mut on_gpu = attach();
    on_gpu.device = uuid.parse().unwrap();
    (on_gpu.start, on_gpu.offset) = EpochOffset {
        epoch: 3,
        consumed: 5120,
    }
    .resume();
    for (a, json) in [(attach(), plain), (on_gpu, elastic)] {
        let mut want = header.to_vec();
        want.extend_from_slice(json.as_bytes());
        let m = Message::Attach(Box::new(a));
        assert_eq!(
            String::from_utf8_lossy(&m.encode().unwrap()),
            String::from_utf8_lossy(&want)
        );
        assert_eq!(Message::decode(&want).unwrap(), m);
    }
}

#[test]
fn an_attach_naming_no_device_is_refused_as_an_unsupported_device() {
    let encoded = Message::Attach(Box::new(attach())).encode().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&encoded[HEADER_BYTES..]).unwrap();
    for (name, ok) in [
        ("tpu", false),
        ("cuda:x", false),
        ("cuda:1", true),
        ("cpu", true),
    ] {
        json["device"] = name.into();
        let mut bytes = encoded[..HEADER_BYTES].to_vec();
        bytes.extend(serde_json::to_vec(&json).unwrap());
        match Message::decode(&bytes) {
            Ok(Message::Attach(a)) if ok => assert_eq!(a.device.to_string(), name),
            Err(e) if !ok => {
                assert_eq!(e, DecodeError::Device(UnknownDevice(name.into())));
                assert_eq!(e.code(), ErrorCode::UnsupportedDevice);
                assert!(e.to_string().contains(&format!("{name:?}")), "{e}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}
