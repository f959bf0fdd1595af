//! S3 error bodies (on AWS they carry the access key id and the string to sign) reach only the
//! dataset's owner (root and the daemon's uid, who configured it): another user is told the
//! S3 code and the dataset's name, nothing of the body.

use super::*;
use std::os::unix::fs::PermissionsExt;
use stoker_testkit::child::{self, OTHER_UID};
use stoker_testkit::client_process;

#[test]
fn another_user_gets_the_s3_code_and_the_dataset_name_not_the_body() {
    if !child::can_run_as_other_uid(
        "another_user_gets_the_s3_code_and_the_dataset_name_not_the_body",
    ) {
        return;
    }
    let served = Served::folder();
    let extra = format!(
        "[access]\nallowed_uids = [0, {OTHER_UID}]\n\n[datasets]\nwrongsecret = \
         \"s3://{BUCKET}/folder/\"\n\n[s3.datasets.wrongsecret]\nendpoint = \"{}\"\n\
         path_style = true\nregion = \"us-east-1\"\naccess_key_id = \"{ACCESS_KEY}\"\n\
         secret_access_key = \"not-the-secret\"\n",
        served.weed.endpoint()
    );
    let top = served.dir.path();
    let config = write_config(top, &served.weed, "", &extra);
    let daemon = Daemon::start_configured(top, &config, &["--threads", "1"]);
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();

    // The owner (root) is told everything the server said.
    let err = Client::attach(daemon.socket(), options("wrongsecret", "own", 0, 1, 4)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("SignatureDoesNotMatch") && text.contains('<'),
        "the owner gets the body: {text}"
    );
    let theirs = client_process::run_as_other_uid(
        "attach-error",
        &[daemon.socket().as_os_str(), "wrongsecret".as_ref()],
    );
    println!("uid {OTHER_UID} was told: {theirs}");
    let line = theirs
        .lines()
        .find(|l| l.starts_with("refused:"))
        .unwrap_or_else(|| panic!("{theirs}"));
    assert!(
        line.contains("UnknownDataset")
            && line.contains("SignatureDoesNotMatch")
            && line.contains("wrongsecret"),
        "{line}"
    );
    for secret in ["<", ACCESS_KEY, "StringToSign", "s3://"] {
        assert!(
            !theirs.contains(secret),
            "uid {OTHER_UID} was shown {secret:?} of the S3 error: {theirs}"
        );
    }
}
