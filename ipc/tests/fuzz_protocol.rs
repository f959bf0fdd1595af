//! Fuzzing the protocol decoder with proptest: arbitrary bytes, bytes behind a valid header,
//! and valid messages with bytes flipped, cut or appended. The decoder must return a message
//! or an error, never panic; what it accepts must re-encode, and an accepted ATTACH's spec must
//! validate or be refused without a panic (the daemon sizes a ring from it).
//!
//! Short mode (CI): [`fuzz_cases::DEFAULT_CASES`] cases per property. Long mode:
//! `STOKER_FUZZ_CASES=1000000 cargo test -p stoker-client --release --test fuzz_protocol`.
//! A failing case is saved by proptest under `proptest-regressions/` and replayed first on
//! every later run; add it as a named test below as well.

use proptest::prelude::*;
use stoker::protocol::{
    Attach, EpochOffset, Message, Position, Ready, Release, HEADER_BYTES, MAGIC, MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
};
use stoker::{ErrorCode, PipelineSpec, RingLayout};

use stoker_testkit::fuzz_cases;

use fuzz_cases::cases;

fn samples() -> Vec<Vec<u8>> {
    let attach = Attach {
        job: "job".into(),
        rank: 1,
        world_size: 4,
        device: stoker::Device::Cpu,
        spec: PipelineSpec::train(8, 32),
        dataset: "/data/train".into(),
        seed: 9,
        // The elastic form, so mutations reach the offset's fields too.
        start: Position::at(1, 3),
        offset: Some(EpochOffset {
            epoch: 1,
            consumed: 40,
        }),
    };
    [
        Message::Attach(Box::new(attach)),
        Message::Ready(Ready {
            slot: 1,
            generation: 2,
            epoch: 3,
            step: 4,
            n: 5,
        }),
        Message::Release(Release {
            slot: 1,
            generation: 7,
        }),
        Message::Detach,
        Message::EndOfData,
        Message::error(ErrorCode::Quota, "over"),
    ]
    .iter()
    .map(|m| m.encode().unwrap())
    .collect()
}

/// What the daemon does with a decoded message: nothing here may panic.
fn use_decoded(bytes: &[u8]) {
    let Ok(msg) = Message::decode(bytes) else {
        return;
    };
    let again = msg.encode().expect("a decoded message re-encodes");
    assert_eq!(
        Message::decode(&again).expect("re-encoded bytes decode"),
        msg
    );
    if let Message::Attach(a) = msg {
        if a.spec.validate().is_ok() {
            let layout = RingLayout::new(&a.spec, 4, 4096);
            assert!(layout.ring_bytes >= layout.slot.slot_bytes);
        }
    }
}

fn header(ty: u16) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h.extend_from_slice(&ty.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    assert_eq!(h.len(), HEADER_BYTES);
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        use_decoded(&bytes);
    }

    #[test]
    fn any_body_behind_a_valid_header_never_panics(
        ty in 0u16..11,
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = header(ty);
        bytes.extend_from_slice(&body);
        use_decoded(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        which in 0usize..6,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
        tail in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut bytes = samples()[which].clone();
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v;
        }
        if do_cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        bytes.extend_from_slice(&tail);
        use_decoded(&bytes);
    }

    #[test]
    fn json_attach_bodies_never_panic(text in "\\PC{0,200}") {
        let mut bytes = header(1);
        bytes.extend_from_slice(text.as_bytes());
        use_decoded(&bytes);
    }
}

#[test]
fn oversized_and_empty_datagrams_are_errors() {
    assert!(Message::decode(&vec![0u8; MAX_MESSAGE_BYTES + 1]).is_err());
    assert!(Message::decode(&[]).is_err());
    assert!(Message::decode(&header(1)).is_err());
}

#[test]
fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
    let mut bytes = header(1);
    bytes.extend(std::iter::repeat_n(b'[', 20_000));
    assert!(Message::decode(&bytes).is_err());
}
