//! Memory per user: one user's crafted tall JPEGs fill no more of the entry-point table than
//! that user's budget, and the table lets a user's entries go when the grace after the
//! user's last job ends (`limits.entry_grace_s`) has passed;
//! jobs of one user on one dataset share one index, and another user's jobs get their own.
//! Both read from the daemon's own gauges (`stoker_entry_table_bytes`, `stoker_index_bytes`).

use super::*;
use stoker_testkit::images::write_folder_of;
use stoker_testkit::prometheus::{http_get, sample};
use stoker_testkit::{encode_jpeg, synthetic_rgb};

/// The entry-point budget per user the tests configure.
const ENTRY_BUDGET: u64 = 256 << 10;

/// A daemon with `[limits] extra`, the datasets `tall` and `reg` registered, root and
/// [`OTHER_UID`] allowed, and its metrics at the address returned.
fn memory_daemon(top: &Path, extra: &str) -> (Daemon, String) {
    let tall = top.join("tall");
    // 120 JPEGs 128 x 4096: 256 MCU rows of 8 MCUs each, the crafted shape of the issue (a
    // training crop of the middle walks about 1,000 entries of each).
    write_folder_of(&tall, 2, 60, |c, i| {
        let (w, h) = (128, 4096);
        encode_jpeg(&synthetic_rgb(w, h, c * 1000 + i), w, h, 50)
    });
    let reg = top.join("reg");
    write_image_folder(&reg, 2, 400, 8);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let config = write_config(
        top,
        &format!(
            "[limits]\n{extra}\n[access]\nallowed_uids = [0, {OTHER_UID}]\n[datasets]\n\
             tall = \"{}\"\nreg = \"{}\"\n",
            tall.display(),
            reg.display()
        ),
    );
    let daemon = Daemon::start_configured(
        top,
        &config,
        &["--threads", "2", "--metrics-listen", &metrics],
    );
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    (daemon, metrics)
}

/// The value of gauge `name` on the daemon's page at `metrics`.
// A gauge of bytes or jobs: a whole number, not negative, well under 2^53.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn gauge(metrics: &str, name: &str) -> u64 {
    let text = http_get(metrics, "/metrics").1;
    sample(&text, name).unwrap_or_else(|| panic!("no {name} on the page:\n{text}")) as u64
}

/// Waits until the daemon serves no job (the last client's job is gone), then returns gauge
/// `name`. The wait is for a state, not a time: it fails only if the jobs never end.
fn once_no_jobs(metrics: &str, name: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    while gauge(metrics, "stoker_jobs") > 0 {
        assert!(Instant::now() < deadline, "the jobs never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A worker may still hold the last job for the batch it was filling.
    let mut value = gauge(metrics, name);
    while value > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        value = gauge(metrics, name);
    }
    value
}

/// Waits until gauge `name` reads `value` (an idle user's entries go when their grace
/// passes), then returns it; after 30 s, whatever it reads. A wait for a state, not a time.
fn once_back_to(metrics: &str, name: &str, value: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = gauge(metrics, name);
    while now != value && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = gauge(metrics, name);
    }
    now
}

#[test]
fn one_users_tall_jpegs_stay_within_its_entry_budget_and_go_with_its_jobs() {
    let test = "one_users_tall_jpegs_stay_within_its_entry_budget_and_go_with_its_jobs";
    if !child::can_run_as_other_uid(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A grace of a second: entries outlive their owner's last job by that (the wait below).
    let (daemon, metrics) = memory_daemon(
        dir.path(),
        &format!("entry_bytes_per_uid = {ENTRY_BUDGET}\nentry_grace_s = 1"),
    );
    // Root reads the tall files twice (a file's first sight is decoded plainly, its second
    // walks) and stays attached: its job lives.
    let mut mine = Client::attach(
        daemon.socket(),
        options("tall", "root-tall", 0, 1, spec(4, 16, Some(2))),
    )
    .unwrap();
    let batches = drain(&mut mine);
    assert!(!batches.is_empty());
    let held = gauge(&metrics, "stoker_entry_table_bytes");
    println!("root's live job: the entry table holds {held} bytes (budget {ENTRY_BUDGET})");
    // Every way the table went wrong, reported together.
    let mut wrong = Vec::new();
    if held == 0 || held > ENTRY_BUDGET {
        wrong.push(format!(
            "one user's tall JPEGs made the entry table hold {held} bytes (per-user budget \
             {ENTRY_BUDGET})"
        ));
    }
    // The other user reads them too, in a process of its own, while root's job lives: root's
    // entries stay, the other user's go with its job.
    let said = stoker_testkit::client_process::run_as_other_uid(
        "train",
        &[daemon.socket().as_os_str(), "tall".as_ref()],
    );
    assert!(said.contains("trained 120 images"), "{said}");
    let both = once_back_to(&metrics, "stoker_entry_table_bytes", held);
    println!("after uid {OTHER_UID}'s job ended: {both} bytes");
    if both != held {
        wrong.push(format!(
            "after uid {OTHER_UID}'s job ended the table held {both} bytes, root's alone \
             were {held}"
        ));
    }
    drop(mine);
    let left = once_no_jobs(&metrics, "stoker_entry_table_bytes");
    println!("after every job ended: {left} bytes");
    if left != 0 {
        wrong.push(format!(
            "the entry table kept {left} bytes after every user's last job ended"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn jobs_of_one_user_on_one_dataset_share_one_index() {
    if !child::can_run_as_other_uid("jobs_of_one_user_on_one_dataset_share_one_index") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, metrics) = memory_daemon(dir.path(), "max_jobs = 16");
    let attach = |job: &str, seed: u64| {
        let mut o = options("reg", job, 0, 1, spec(2, 16, None));
        o.seed = seed;
        Client::attach(daemon.socket(), o).unwrap()
    };
    let first = attach("root-0", 1);
    let one = gauge(&metrics, "stoker_index_bytes");
    assert!(one > 0, "no index bytes for a live job");
    let more: Vec<Client> = (1..4)
        .map(|i| attach(&format!("root-{i}"), i + 1))
        .collect();
    let four = gauge(&metrics, "stoker_index_bytes");
    println!("root's index: {one} bytes for 1 job, {four} for 4 jobs on the same dataset");
    // Another user's jobs on the same dataset: an index of that user's own, once.
    let (mut child, _, said) = super::users::hog(daemon.socket(), 3, 0.0);
    assert_eq!(said.matches(": attached").count(), 3, "{said}");
    let theirs = gauge(&metrics, "stoker_index_bytes");
    println!("with uid {OTHER_UID}'s 3 jobs: {theirs} bytes");
    let _ = child.kill();
    let _ = child.wait();
    let mut wrong = Vec::new();
    if four != one {
        wrong.push(format!(
            "4 jobs of one user on one dataset hold {four} bytes of index, 1 job held {one}"
        ));
    }
    // Their index is their own (opened with their credentials; its vectors' capacities may
    // differ from root's), and held once for their 3 jobs.
    if theirs <= four || theirs - four > one {
        wrong.push(format!(
            "uid {OTHER_UID}'s 3 jobs beside root's {four} bytes made the indexes hold \
             {theirs} bytes (one index of their own: at most {})",
            four + one
        ));
    }
    drop((first, more));
    let left = once_no_jobs(&metrics, "stoker_index_bytes");
    if left != 0 {
        wrong.push(format!("{left} bytes of index left after every job ended"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
