//! Two hosts serve one job exactly; a crashed host resumes its ranks.

use super::*;

/// World size 4, ranks 0-1 on host A and 2-3 on host B, 3 epochs: every epoch is the exact
/// DistributedSampler partition, and every rank gets exactly the batches (indices and pixels)
/// one daemon serving all four ranks gives. Host B is killed (SIGKILL) mid-epoch while its
/// ranks are between batches; host A's ranks keep receiving batches while it is down, and once
/// B is back its ranks resume exactly where they were.
#[test]
fn two_hosts_serve_one_job_exactly_and_a_crashed_host_resumes_its_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let (classes, per_class) = (4, 10); // 40 samples: 10 per rank, 5 steps of 2 per epoch
    let len = u64::from(classes * per_class);
    let mut a = Host::new(tmp.path(), "host-a", classes, per_class);
    let mut b = Host::new(tmp.path(), "host-b", classes, per_class);
    let netns = match netns_available() {
        Ok(()) => Some(some_port()),
        Err(why) => {
            eprintln!(
                "two_hosts_serve_one_job_exactly_and_a_crashed_host_resumes_its_ranks: \
                 NOT using network namespaces (unshare --net: {why}); the two daemons share \
                 this machine's network stack"
            );
            None
        }
    };
    a.start(netns);
    b.start(netns);
    if netns.is_some() {
        let own = net_namespace(std::process::id());
        let (na, nb) = (net_namespace(a.pid()), net_namespace(b.pid()));
        assert!(na != own && nb != own && na != nb, "{na:?} {nb:?} {own:?}");
    }

    // The reference: one daemon (host A) serves all four ranks of another job.
    let reference: Vec<RankProcess> = (0..4)
        .map(|r| RankProcess::spawn(&orders(tmp.path(), &a.socket(), "ref", r, 4)))
        .collect();
    let reference: Vec<Vec<Delivered>> = reference
        .into_iter()
        .map(|p| delivered(&p.finish()))
        .collect();
    for epoch in 0..3 {
        assert_eq!(assert_exact_partition(&reference, epoch, len), 5);
    }

    // The two-host job. Every rank pauses after 6 batches (the next is epoch 1, step 1).
    let ranks: Vec<RankProcess> = (0..4)
        .map(|r| {
            let host = if r < 2 { &a } else { &b };
            let mut o = orders(tmp.path(), &host.socket(), "job", r, 4);
            o.hold_after = Some(6);
            o.gate = tmp.path().join(if r < 2 { "gate-a" } else { "gate-b" });
            RankProcess::spawn(&o)
        })
        .collect();
    wait_for(
        || ranks.iter().all(|p| p.count("H") == 1),
        "every rank at its hold",
    );

    // Host B crashes. Host A's ranks go on and finish all three epochs while B is down.
    b.kill();
    std::fs::write(tmp.path().join("gate-a"), "").unwrap();
    wait_for(
        || ranks[..2].iter().all(|p| p.count("E") == 1),
        "host A's ranks to finish while host B is down",
    );
    assert!(ranks[..2].iter().all(|p| p.count("B") == 15));
    assert!(ranks[2..].iter().all(|p| p.count("D") == 0));
    // B's ranks take the batches already announced to them (up to the 2 slots of their
    // rings, complete before the crash), find their daemon gone and retry; then B comes back
    // and they resume, still inside epoch 1.
    std::fs::write(tmp.path().join("gate-b"), "").unwrap();
    wait_for(
        || ranks[2..].iter().all(|p| p.count("D") == 1),
        "host B's ranks to see their daemon gone",
    );
    assert!(ranks[2..].iter().all(|p| (6..=8).contains(&p.count("B"))));
    b.start(netns);

    let logs: Vec<Vec<String>> = ranks.into_iter().map(RankProcess::finish).collect();
    for log in &logs[2..] {
        let at = log.iter().position(|l| l == "D").expect("a D line");
        let last = delivered(&log[..at]).pop().unwrap();
        let resumed = format!("R {} {}", last.epoch, last.step + 1);
        assert_eq!(log[at + 1], resumed, "{log:?}");
        assert!(
            last.epoch == 1 && last.step + 1 < 5,
            "not mid-epoch: {log:?}"
        );
    }
    let got: Vec<Vec<Delivered>> = logs.iter().map(|l| delivered(l)).collect();
    for epoch in 0..3 {
        assert_eq!(assert_exact_partition(&got, epoch, len), 5);
    }
    // No batch lost or repeated across the crash, and the same batches as one daemon's.
    for r in 0..4 {
        assert_eq!(
            got[r], reference[r],
            "rank {r} differs from the one-daemon run"
        );
    }
}
