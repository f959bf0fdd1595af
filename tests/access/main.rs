//! Access: the uids and gids a daemon serves, the roots a dataset path must stay under, ring
//! quotas and limits, rings no other connection can obtain, and clients of another uid (a
//! real separate uid, see `stoker_testkit::child`) refused by their own credentials.

mod caches;
mod daemon_uid;
mod groups;
mod install;
mod jobs;
mod memory;
mod other_uid;
mod rings;
mod rules;
mod service_user;
mod users;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};
use stoker::protocol::{Attach, Attached, Message, Position, Ready, Release, MAX_MESSAGE_BYTES};
use stoker::socket::SeqPacket;
use stoker::{AttachOptions, Client, ErrorCode, PipelineSpec};
use stoker_testkit::attach::{rank_options, u8_spec as spec};
use stoker_testkit::batches::{drain, write_config};
use stoker_testkit::child::{self, OTHER_UID};
use stoker_testkit::tiny_dataset;
use stoker_testkit::{read_log, write_image_folder, write_jpeg, Daemon};

fn options(data: &str, job: &str, rank: u32, world: u32, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (rank, world), 77, spec)
}
