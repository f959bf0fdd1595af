//! `s3://` URLs named one by one (the entries of a file list): a HEAD request each for the
//! object's size and ETag, all in flight at once within the hub's request limit, remembered
//! so the reader finds them like listed objects.
//!
//! # Design
//! - Each URL's connection is the one its URL gets as a dataset (`[s3.default]` unless a
//!   registered `s3://` dataset has exactly that URL); its bucket's client is shared.
//! - The caller decides whether the URLs may be read at all (the daemon's credentials).
//!
//! # Limitations
//! - One request per URL: a list of a million objects costs a million HEADs at each index.

use std::path::Path;

use super::client::S3Error;
use super::{block_on, permits, remember, remote_for, S3Url};

/// Object storage as the index sees it (a file list's `s3://` entries).
pub struct ObjectStorage;

impl crate::source::index::RemoteFiles for ObjectStorage {
    fn head(&self, urls: &[&Path]) -> Vec<Result<crate::source::index::RemoteFile, String>> {
        head_urls(urls)
            .into_iter()
            .map(|r| {
                r.map(|e| crate::source::index::RemoteFile {
                    url: e.url,
                    size: e.size,
                })
                .map_err(|e| e.to_string())
            })
            .collect()
    }
}

/// An object named by URL: its URL as the reader knows it, and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub url: String,
    pub size: u64,
}

/// HEADs every URL in `urls` at once (at most `max_in_flight` in flight); one result each.
pub fn head_urls(urls: &[&Path]) -> Vec<Result<Entry, S3Error>> {
    let permits = permits();
    let run = async {
        let mut tasks = Vec::with_capacity(urls.len());
        for u in urls {
            let text = u.to_string_lossy().into_owned();
            let parsed = match S3Url::parse(u) {
                Some(Ok(p)) if !p.prefix.is_empty() && !p.prefix.ends_with('/') => Ok(p),
                Some(Err(reason)) => Err(S3Error::local(&text, reason)),
                _ => Err(S3Error::local(
                    &text,
                    "an entry must name one object: s3://bucket/key".into(),
                )),
            };
            let target = parsed.and_then(|p| Ok((remote_for(&p)?, p)));
            let permits = permits.clone();
            tasks.push(tokio::spawn(async move {
                let (remote, url) = target?;
                let _permit = permits
                    .acquire_owned()
                    .await
                    .map_err(|e| S3Error::local(&text, e.to_string()))?;
                let info = remote.head(&url.prefix).await?;
                remember(&remote, std::slice::from_ref(&info));
                Ok(Entry {
                    url: remote.url(&info.key),
                    size: info.size,
                })
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for (t, u) in tasks.into_iter().zip(urls) {
            out.push(
                t.await
                    .unwrap_or_else(|e| Err(S3Error::local(&u.to_string_lossy(), e.to_string()))),
            );
        }
        out
    };
    match block_on(run) {
        Ok(v) => v,
        Err(reason) => urls
            .iter()
            .map(|u| Err(S3Error::local(&u.to_string_lossy(), reason.clone())))
            .collect(),
    }
}
