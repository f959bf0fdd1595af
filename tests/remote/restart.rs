//! A worker restarted on its address while a home daemon's connections hold units: each
//! held unit is re-issued (filled locally), none is lost or served twice, and the home
//! daemon reconnects to the new worker process without a restart of its own.

use super::*;

#[test]
fn a_worker_restarted_mid_unit_costs_only_reissued_units_and_is_used_again() {
    let world = World::new();
    let expected = reference(&world);
    let addr = format!("127.0.0.1:{}", free_port());
    let (mut first, _, addr) = world.worker_at("worker-first", &addr, "");
    let (home, home_log, metrics) = world.home_with("home", &[&addr], 2);
    // The home connects when its first units come: a job this small may end before then (or
    // while a first try backs off), so jobs run until the first worker has done units.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(serve_job(home.socket(), &world.data, 0, || {}), expected);
        let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
        if remote_units(&text, &addr, "done") > 0.0 {
            break;
        }
        let log = read_log(&home_log);
        assert!(
            Instant::now() < deadline,
            "the first worker was never used:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(600));
    }
    let mut second = None;
    let batches = serve_job(home.socket(), &world.data, 3, || {
        first.signal(libc::SIGKILL);
        let _ = first.wait_exit(Duration::from_secs(10));
        second = Some(world.worker_at("worker-second", &addr, ""));
    });
    // Same batches: every sample once, in place, none lost or duplicated.
    assert_eq!(batches, expected);
    let (_second, second_log, _) = second.unwrap();
    // The next job, once the home's backoff (at most 2 s here) has passed, is served by
    // the new worker process.
    std::thread::sleep(Duration::from_secs(2));
    let again = serve_job(home.socket(), &world.data, 0, || {});
    assert_eq!(again, expected);
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    assert!(remote_units(&text, &addr, "done") > 0.0, "{text}");
    let log = read_log(&home_log);
    let connects = log.matches("connected to a remote worker").count();
    assert!(
        connects >= 3,
        "{connects} connects in the home's log:\n{log}"
    );
    drop(home);
    assert!(
        units_done(&second_log) > 0,
        "the restarted worker did no unit:\n{}",
        read_log(&second_log)
    );
}
