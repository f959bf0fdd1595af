//! `s3://` URLs named one by one (the entries of a file list): a HEAD request each for the
//! object's size and ETag, all in flight at once within the store's request limit, remembered
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
use super::{ObjectStore, S3Url};

/// An object named by URL: its URL as the reader knows it, and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The normalised `s3://` URL.
    pub url: String,
    /// The object's size in bytes.
    pub size: u64,
}

impl ObjectStore {
    /// HEADs every URL in `urls` at once (at most `max_in_flight` in flight); one result each.
    pub fn head_urls(&self, urls: &[&Path]) -> Vec<Result<Entry, S3Error>> {
        let slots = self.slots();
        let run = async {
            let mut tasks = Vec::with_capacity(urls.len());
            for u in urls {
                let text = u.to_string_lossy().into_owned();
                let parsed = match S3Url::parse(u) {
                    Some(Ok(p)) if !p.prefix.is_empty() && !p.prefix.ends_with('/') => Ok(p),
                    Some(Err(e)) => Err(S3Error::local(&text, e.to_string())),
                    _ => Err(S3Error::local(
                        &text,
                        "an entry must name one object: s3://bucket/key".into(),
                    )),
                };
                let target = parsed.and_then(|p| Ok((self.remote_for(&p)?, p)));
                let slots = slots.clone();
                tasks.push(tokio::spawn(async move {
                    let (remote, url) = target?;
                    let endpoint = format!("{} {}", remote.origin, remote.bucket());
                    let flow = super::slots::Flow::own(&text);
                    let _slot = (slots.acquire(&flow, &endpoint).await).ok_or_else(|| {
                        S3Error::local(&text, "the request slots are closed".into())
                    })?;
                    let info = remote.head(&url.prefix).await?;
                    Ok((remote, info))
                }));
            }
            let mut out = Vec::with_capacity(tasks.len());
            for (t, u) in tasks.into_iter().zip(urls) {
                let got = t
                    .await
                    .unwrap_or_else(|e| Err(S3Error::local(&u.to_string_lossy(), e.to_string())));
                out.push(got.map(|(remote, info)| {
                    self.remember(&remote, std::slice::from_ref(&info));
                    Entry {
                        url: remote.url(&info.key),
                        size: info.size,
                    }
                }));
            }
            out
        };
        match self.block_on(run) {
            Ok(v) => v,
            Err(e) => urls
                .iter()
                .map(|u| Err(S3Error::local(&u.to_string_lossy(), e.to_string())))
                .collect(),
        }
    }
}
