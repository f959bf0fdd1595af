//! An `s3://` prefix names a folder, never its neighbours: a dataset `s3://b/data` holds
//! what is under `data/` and nothing of `data2/`, on a home daemon and on a worker allowed
//! `s3://b/data`, which also refuses `s3://b/data2` and a `..` that climbs out.

use std::collections::BTreeSet;

use stoker_testkit::attach::rank_options;

use super::refusals::secret;
use super::s3::{Weed, BUCKET};
use super::*;

#[test]
fn a_dataset_and_a_worker_prefix_hold_nothing_of_a_neighbour_named_alike() {
    let world = World::new();
    let weed = Weed::start(&world.dir("s3"));
    let data = world.dir("upload-data");
    write_image_folder(&data, 2, 4, 32);
    let neighbour = world.dir("upload-data2");
    write_image_folder(&neighbour, 3, 4, 32);
    weed.upload(&data, "data");
    weed.upload(&neighbour, "data2");
    let url = format!("s3://{BUCKET}/data");
    let addr = format!("127.0.0.1:{}", free_port());
    let wdir = world.dir("worker");
    let keys = format!("s3_prefixes = [{url:?}]\n{}", weed.config(&wdir));
    let (_worker, worker_log, addr) = world.worker_at("worker", &addr, &keys);
    let hdir = world.dir("home");
    let (home, home_log, metrics) = world.home_configured("home", &[&addr], &weed.config(&hdir));
    // Jobs until the worker has done units too (the home's own thread may win every unit
    // of a small job); each serves exactly the 8 images of `data/`.
    let mut runs = 0;
    loop {
        let spec = u8_spec(4, 64, Some(2));
        let opts = rank_options(&url, &format!("s3-job-{runs}"), (0, 1), SEED, spec);
        let mut client = Client::attach(home.socket(), opts).unwrap();
        let batches = drain(&mut client);
        let served: BTreeSet<u64> = batches.iter().flat_map(|b| b.indices.clone()).collect();
        assert_eq!(
            served,
            (0..8).collect(),
            "s3://{BUCKET}/data holds 8 images; home log:\n{}",
            read_log(&home_log)
        );
        runs += 1;
        let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
        if remote_units(&text, &addr, "done") > 0.0 {
            break;
        }
        assert!(
            runs < 10,
            "no unit done by the worker; home log:\n{}\nworker log:\n{}",
            read_log(&home_log),
            read_log(&worker_log)
        );
    }

    // A neighbour and a climb out of the prefix are refused by the worker.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let soon = || Instant::now() + Duration::from_secs(10);
    let key = secret(&world, "a-test-secret-of-some-length");
    let mut session = stoker_daemon::remote::auth::connect(&mut s, &key, soon()).unwrap();
    for (job, dataset) in [(1, format!("{url}2")), (2, format!("{url}/../data2"))] {
        let open = stoker_daemon::remote::wire::OpenJob {
            job,
            dataset: dataset.clone(),
            fingerprint: String::new(),
            spec: u8_spec(4, 32, None),
            seed: 1,
            policy: stoker_pipeline::engine::BadSamplePolicy::Skip,
            max_pixels: 1 << 20,
            max_file_bytes: 1 << 20,
        };
        use stoker_daemon::remote::wire::Message;
        session
            .write(&mut s, &Message::Open(Box::new(open)), &[])
            .unwrap();
        match session.read(&mut s, Some(soon())).unwrap() {
            Message::Refused { reason, .. } => {
                assert!(reason.contains("s3_prefixes"), "{dataset}: {reason}");
            }
            other => panic!("{dataset}: {other:?}"),
        }
    }
}
