//! One bucket on one S3-compatible service, through `object_store`: listing, whole-object
//! downloads to a file, uploads and deletes, with retries and backoff on throttling and
//! server errors, and errors that carry the S3 error code.
//!
//! # Design
//! object_store's own retries are off: ours count every retry in the metrics and back off
//! from `s3.backoff_ms`. The S3 error code is read from the response body object_store puts in
//! its message (`<Code>...</Code>`), else the HTTP status, else `connection`.
//!
//! Every GET is for the object the index names ([`Expected`]): it says `If-Match` with the
//! indexed ETag, the answer's ETag and size are compared with the index's before its body is
//! read (a server that ignores If-Match is caught there), and a body is never read past the
//! size asked for. An answer for another object is a `changed` error, never retried.
//!
//! # Limitations
//! A server that lies about an object's ETag is believed: the ETag is the only identity S3
//! lists. Recognising the code from the message
//! text depends on object_store keeping the body in it.

use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, PutPayload, RetryConfig,
};

use super::config::{Connection, S3Config, MAX_BACKOFF_MS};
pub use super::error::{S3Error, S3ErrorKind};
use super::listing::Lister;
pub use super::listing::ObjectInfo;
use super::listing::MAX_EMPTY_PAGES;
use super::metric;
use crate::source::index::Asker;
use crate::source::integrity::{Tag, TagKey};

/// One bucket of one service.
#[derive(Debug)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    lister: Lister,
    bucket: String,
    /// Identifies the service in cache file names (the endpoint, or the region).
    pub origin: String,
    retries: u32,
    backoff: Duration,
    /// How long an answer may go without a byte (`s3.stall_timeout_ms`).
    stall: Duration,
}

impl Remote {
    /// A client for `bucket` over `conn` (keys it leaves out come from the environment).
    pub fn new(conn: &Connection, bucket: &str, cfg: &S3Config) -> Result<Remote, S3Error> {
        let url = format!("s3://{bucket}");
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let endpoint = conn
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT").ok());
        if let Some(e) = &endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(r) = &conn.region {
            b = b.with_region(r);
        }
        if let Some(p) = conn.path_style {
            b = b.with_virtual_hosted_style_request(!p);
        }
        if let Some(k) = &conn.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(s) = &conn.secret_access_key {
            b = b.with_secret_access_key(s);
        }
        if let Some(t) = &conn.session_token {
            b = b.with_token(t);
        }
        // allow_http goes inside ClientOptions: with_client_options would reset it otherwise.
        let allow_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
            || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true" || v == "1");
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let options = ClientOptions::new()
            .with_allow_http(allow_http)
            .with_timeout(timeout)
            .with_connect_timeout(timeout.min(Duration::from_secs(5)));
        // Retries are ours (counted, and with the configured backoff), not object_store's.
        let retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let b = b.with_client_options(options.clone()).with_retry(retry);
        let s3 = Arc::new(b.clone().build().map_err(|e| S3Error::of(&url, &e))?);
        let lister = Lister::new(&b, s3.clone(), &options, bucket)?;
        Ok(Remote {
            store: s3,
            lister,
            bucket: bucket.to_owned(),
            origin: endpoint.or(conn.region.clone()).unwrap_or_default(),
            retries: cfg.retries,
            backoff: Duration::from_millis(cfg.backoff_ms),
            stall: Duration::from_millis(cfg.stall_timeout_ms),
        })
    }

    /// The bucket this client reads.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://bucket/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// Runs `op` until it succeeds, fails for good, or the retries are spent.
    async fn with_retries<T, F, Fut>(&self, url: &str, mut op: F) -> Result<T, S3Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, S3Error>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.retryable() && attempt < self.retries => {
                    let wait = (self.backoff * 2u32.saturating_pow(attempt))
                        .min(Duration::from_millis(MAX_BACKOFF_MS));
                    attempt += 1;
                    metrics::counter!(metric::RETRIES_TOTAL).increment(1);
                    tracing::debug!(url, code = %e.code, attempt, "retrying an S3 request");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    metrics::counter!(metric::ERRORS_TOTAL, "code" => e.code.clone()).increment(1);
                    return Err(e);
                }
            }
        }
    }

    /// Every object under `prefix` (paginated listing), in key order, within `bounds`: more
    /// than its `max_objects` is an error naming the limit (`limits.max_index_entries`), and
    /// so are pages that list nothing without end, a continuation token that comes back, the
    /// deadline passed, and the asker gone (checked between pages). Keys object_store cannot
    /// fetch are listed too (see `listing`).
    pub async fn list(
        &self,
        prefix: &str,
        bounds: &ListBounds<'_>,
    ) -> Result<Vec<ObjectInfo>, S3Error> {
        let url = self.url(prefix);
        let mut out: Vec<ObjectInfo> = Vec::new();
        let mut token: Option<String> = None;
        let mut seen_tokens = std::collections::HashSet::new();
        let mut empty = 0u32;
        loop {
            bounds.check(&url)?;
            let t = token.as_deref();
            let page = self.with_retries(&url, || self.lister.page(&url, prefix, t));
            let (page, next) = tokio::time::timeout_at(bounds.deadline.into(), page)
                .await
                .map_err(|_| bounds.late(&url))??;
            empty = if page.is_empty() { empty + 1 } else { 0 };
            out.extend(page);
            let max = bounds.max_objects;
            if out.len() as u64 > max {
                return Err(S3Error {
                    url,
                    kind: S3ErrorKind::Other,
                    code: "too_many_objects".into(),
                    message: format!(
                        "more than {max} objects under the prefix (limits.max_index_entries)"
                    ),
                });
            }
            let Some(n) = next else { break };
            if empty > MAX_EMPTY_PAGES {
                return Err(S3Error::bounded(
                    &url,
                    "list_no_progress",
                    format!(
                        "{empty} truncated listing pages in a row listed no object (at most \
                         {MAX_EMPTY_PAGES}): the server lists without end, refused"
                    ),
                ));
            }
            if !seen_tokens.insert(n.clone()) {
                return Err(S3Error::bounded(
                    &url,
                    "list_no_progress",
                    "the server gave a continuation token it gave before: the listing \
                     would not end, refused"
                        .into(),
                ));
            }
            token = Some(n);
        }
        out.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        out.shrink_to_fit();
        Ok(out)
    }

    /// The size and ETag of the object `key` (a HEAD request).
    pub async fn head(&self, key: &str) -> Result<ObjectInfo, S3Error> {
        let url = self.url(key);
        let path = object_path(key);
        self.with_retries(&url, || async {
            let meta = self
                .store
                .head(&path)
                .await
                .map_err(|e| S3Error::of(&url, &e))?;
            Ok(ObjectInfo {
                key: key.to_owned(),
                size: meta.size,
                etag: meta.e_tag.unwrap_or_default(),
            })
        })
        .await
    }

    /// Downloads the whole object `key` into memory (`to` is `None`) or into the file `to`
    /// (made anew, mode 0600), tagging its bytes with `tags` as they arrive: one pass over
    /// them, nothing read back. The request says `If-Match` with the indexed ETag, and an
    /// answer for another object (another ETag, or a `Content-Length` other than the listed
    /// size) is refused before its body is read; a body is never read past the listed size.
    pub(crate) async fn download(
        &self,
        key: &str,
        expected: Expected<'_>,
        tags: &TagKey,
        to: Option<&Path>,
    ) -> Result<Received, S3Error> {
        let url = self.url(key);
        let path = fetchable(&url, key)?;
        self.with_retries(&url, || async {
            let got = self
                .unstalled(&url, self.store.get_opts(&path, expected.options(None)))
                .await?
                .map_err(|e| S3Error::of(&url, &e))?;
            expected.check(&url, &got.meta, "Content-Length")?;
            let mut body = Body::new(&url, to, expected.size)?;
            let mut tagger = tags.tagger();
            let mut stream = got.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = self.unstalled(&url, stream.next()).await? {
                let chunk = chunk.map_err(|e| S3Error::of(&url, &e))?;
                n += chunk.len() as u64;
                expected.bounded(&url, n, expected.size)?;
                tagger.update(&chunk);
                body.write(&url, &chunk)?;
            }
            Ok(Received {
                size: n,
                tag: tagger.finish(),
                bytes: body.into_bytes(),
            })
        })
        .await
    }

    /// Bytes `range` of the object `key` (a ranged GET, `If-Match` the indexed ETag); an
    /// answer for another object (another ETag, or a total size in `Content-Range` other than
    /// the listed one) is refused before its body is read, a body is never read past the
    /// range, and a short one is an error.
    pub async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        expected: Expected<'_>,
    ) -> Result<Bytes, S3Error> {
        let url = self.url(key);
        let path = fetchable(&url, key)?;
        let want = range.end - range.start;
        self.with_retries(&url, || async {
            let get = self
                .store
                .get_opts(&path, expected.options(Some(range.clone())));
            let got = (self.unstalled(&url, get).await?).map_err(|e| S3Error::of(&url, &e))?;
            expected.check(&url, &got.meta, "Content-Range")?;
            let mut body = BytesMut::new();
            let mut stream = got.into_stream();
            while let Some(chunk) = self.unstalled(&url, stream.next()).await? {
                let chunk = chunk.map_err(|e| S3Error::of(&url, &e))?;
                expected.bounded(&url, (body.len() + chunk.len()) as u64, want)?;
                body.extend_from_slice(&chunk);
            }
            if body.len() as u64 != want {
                return Err(S3Error::local(
                    &url,
                    format!(
                        "asked for {want} bytes at {}, got {} (changed since indexed?)",
                        range.start,
                        body.len()
                    ),
                ));
            }
            Ok(body.freeze())
        })
        .await
    }

    /// `step` (an answer's headers, or its next part), or a `stalled` error once it brought
    /// nothing for the stall timeout: a server that sends half a body and waits is given up
    /// by this deadline of its own, whatever the request's.
    async fn unstalled<T>(
        &self,
        url: &str,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, S3Error> {
        tokio::time::timeout(self.stall, step).await.map_err(|_| {
            metrics::counter!(metric::ERRORS_TOTAL, "code" => "stalled").increment(1);
            S3Error::bounded(
                url,
                "stalled",
                format!(
                    "no byte for {} ms (s3.stall_timeout_ms): given up",
                    self.stall.as_millis()
                ),
            )
        })
    }

    /// Uploads `data` as `key`.
    pub async fn put(&self, key: &str, data: Vec<u8>) -> Result<(), S3Error> {
        let url = self.url(key);
        let path = object_path(key);
        let payload = PutPayload::from(data);
        self.with_retries(&url, || async {
            self.store
                .put(&path, payload.clone())
                .await
                .map(|_| ())
                .map_err(|e| S3Error::of(&url, &e))
        })
        .await
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), S3Error> {
        let url = self.url(key);
        let path = object_path(key);
        self.with_retries(&url, || async {
            self.store
                .delete(&path)
                .await
                .map_err(|e| S3Error::of(&url, &e))
        })
        .await
    }
}

/// A whole object as received: its size, the tag of its bytes (computed as they arrived),
/// and the bytes themselves when they were received into memory.
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes received.
    pub size: u64,
    /// Their tag under the node cache's key.
    pub tag: Tag,
    /// The bytes, when received into memory (`None`: they went to the file asked for).
    pub bytes: Option<Bytes>,
}

/// Where a download's body goes as it arrives.
enum Body<'a> {
    Memory(Vec<u8>),
    File(std::fs::File, &'a Path),
}

impl<'a> Body<'a> {
    /// Into `to` (made anew), or into memory sized for `size` bytes (`to` is `None`).
    fn new(url: &str, to: Option<&'a Path>, size: u64) -> Result<Body<'a>, S3Error> {
        Ok(match to {
            Some(p) => Body::File(
                stoker_private::replace_file(p).map_err(|e| S3Error::write(url, p, &e))?,
                p,
            ),
            // Only objects small enough to hold are received into memory (the caller's
            // rule); the listed size is checked against every chunk, so this is the most
            // it grows to.
            None => Body::Memory(super::buffers::take(usize::try_from(size).unwrap_or(0))),
        })
    }

    fn write(&mut self, url: &str, chunk: &[u8]) -> Result<(), S3Error> {
        match self {
            Body::Memory(v) => {
                v.extend_from_slice(chunk);
                Ok(())
            }
            Body::File(f, p) => f.write_all(chunk).map_err(|e| S3Error::write(url, p, &e)),
        }
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Body::Memory(v) => Some(super::buffers::freeze(v)),
            Body::File(..) => None,
        }
    }
}

/// How far one listing may go.
#[derive(Debug)]
pub struct ListBounds<'a> {
    /// The most objects (`limits.max_index_entries`).
    pub max_objects: u64,
    /// When it must have ended (`s3.list_deadline_ms` after it started).
    pub deadline: std::time::Instant,
    /// Who asked for it: once gone, the listing stops at its next page.
    pub asker: Option<&'a Asker>,
    /// The deadline's length, for messages.
    pub deadline_ms: u64,
}

impl ListBounds<'_> {
    /// Refuses to go on when the asker has gone or the deadline passed.
    fn check(&self, url: &str) -> Result<(), S3Error> {
        if self.asker.is_some_and(Asker::gone) {
            return Err(S3Error::bounded(
                url,
                "client_gone",
                "the client that asked for the dataset has gone: listing stopped".into(),
            ));
        }
        if std::time::Instant::now() >= self.deadline {
            return Err(self.late(url));
        }
        Ok(())
    }

    fn late(&self, url: &str) -> S3Error {
        S3Error::bounded(
            url,
            "list_deadline",
            format!(
                "not listed within {} ms (s3.list_deadline_ms): refused",
                self.deadline_ms
            ),
        )
    }
}

/// What the index says an object is: an answer for anything else is refused, never cached.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The object's size as listed (or HEADed).
    pub size: u64,
    /// Its ETag as listed; empty when the listing gave none (nothing is compared then).
    pub etag: &'a str,
}

impl Expected<'_> {
    /// A GET of `range` (`None`: the whole object), conditional on the indexed ETag.
    fn options(&self, range: Option<Range<u64>>) -> GetOptions {
        let etag = bare_etag(self.etag);
        GetOptions {
            if_match: (!etag.is_empty()).then(|| format!("\"{etag}\"")),
            range: range.map(GetRange::Bounded),
            ..GetOptions::default()
        }
    }

    /// Refuses an answer whose ETag is not the indexed one (a server that ignores If-Match),
    /// or whose object size (`size_from`: the header it came from) is not the listed one.
    fn check(&self, url: &str, meta: &ObjectMeta, size_from: &str) -> Result<(), S3Error> {
        let want = bare_etag(self.etag);
        if !want.is_empty() {
            let got = meta.e_tag.as_deref().map(bare_etag);
            if got != Some(want) {
                return Err(S3Error::changed(
                    url,
                    "etag_mismatch",
                    format!(
                        "the server's ETag is {}, the index's {want}: replaced since it was \
                         listed, refused",
                        got.unwrap_or("missing")
                    ),
                ));
            }
        }
        if meta.size != self.size {
            return Err(S3Error::changed(
                url,
                "size_mismatch",
                format!(
                    "the answer's {size_from} says {} bytes, the listing {}: refused before \
                     reading its body",
                    meta.size, self.size
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a body that went past `limit` bytes (`read` so far): reading stops there.
    fn bounded(&self, url: &str, read: u64, limit: u64) -> Result<(), S3Error> {
        if read <= limit {
            return Ok(());
        }
        Err(S3Error::changed(
            url,
            "size_mismatch",
            format!(
                "the body went past the {limit} bytes asked for (listed size {}): reading \
                 stopped, refused",
                self.size
            ),
        ))
    }
}

/// An ETag without its quotes and weak prefix: `W/"abc"` and `abc` are both `abc`.
fn bare_etag(etag: &str) -> &str {
    etag.trim().trim_start_matches("W/").trim_matches('"')
}

/// The key as object_store fetches it; a key it cannot represent (an empty or `..` segment,
/// a control character) is a `bad_key` error: that object's sample is bad, nothing else.
fn fetchable(url: &str, key: &str) -> Result<ObjectPath, S3Error> {
    ObjectPath::parse(key).map_err(|e| S3Error {
        url: url.to_owned(),
        kind: S3ErrorKind::Other,
        code: "bad_key".into(),
        message: format!("the key cannot be fetched through object_store: {e}"),
    })
}

/// A key as object_store wants it: as listed (already valid) or encoded.
fn object_path(key: &str) -> ObjectPath {
    ObjectPath::parse(key).unwrap_or_else(|_| ObjectPath::from(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_failures_are_retried() {
        let e = |kind, code: &str| S3Error {
            url: "s3://b/k".into(),
            kind,
            code: code.into(),
            message: String::new(),
        };
        assert!(e(S3ErrorKind::Other, "HTTP 503").retryable());
        assert!(e(S3ErrorKind::Other, "SlowDown").retryable());
        assert!(e(S3ErrorKind::Other, "connection").retryable());
        assert!(!e(S3ErrorKind::Other, "HTTP 400").retryable());
        assert!(!e(S3ErrorKind::NotFound, "NoSuchKey").retryable());
        assert!(!e(S3ErrorKind::Permission, "SignatureDoesNotMatch").retryable());
    }
}
