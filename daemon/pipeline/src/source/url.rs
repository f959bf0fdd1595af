//! Where a dataset path names object storage: `s3://bucket/prefix` URLs, parsed.
//!
//! # Design
//! Pure text rules, shared by the index (which routes a URL to object storage) and object
//! storage (which reads it); this module holds no state and imports neither.
//!
//! # Limitations
//! Only the `s3://` scheme is known.

#![forbid(unsafe_code)]

use std::path::Path;

/// Why an `s3://` URL cannot name objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// `s3://` with nothing, or a `/`, where the bucket's name goes.
    #[error("{url}: no bucket name")]
    NoBucket {
        /// The URL as given.
        url: String,
    },
}

/// `s3://bucket/prefix`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Url {
    /// The bucket's name.
    pub bucket: String,
    /// The key prefix, without a leading `/`; may be empty.
    pub prefix: String,
}

impl S3Url {
    /// The URL in `path`, if it is one (`None` for local paths).
    pub fn parse(path: &Path) -> Option<Result<S3Url, UrlError>> {
        let s = path.to_str()?;
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(UrlError::NoBucket { url: s.to_owned() }));
        }
        Some(Ok(S3Url {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_start_matches('/').to_owned(),
        }))
    }

    /// The URL of `name` under this prefix.
    pub fn join(&self, name: &str) -> S3Url {
        S3Url {
            bucket: self.bucket.clone(),
            prefix: join_key(&self.prefix, name),
        }
    }

    /// The URL written back (`s3://bucket/prefix`).
    pub fn as_string(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Whether `path` names object storage.
pub fn is_url(path: &Path) -> bool {
    path.as_os_str().as_encoded_bytes().starts_with(b"s3://")
}

/// `rel` under the key `prefix` (one `/` between them; `rel` alone under an empty prefix).
pub(crate) fn join_key(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() {
        rel.to_owned()
    } else {
        format!("{}/{rel}", prefix.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_bucket_and_prefix() {
        let u = S3Url::parse(Path::new("s3://data/imagenet/train"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("data", "imagenet/train")
        );
        let u = S3Url::parse(Path::new("s3://data")).unwrap().unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("data", ""));
        assert!(S3Url::parse(Path::new("s3:///x")).unwrap().is_err());
        assert!(S3Url::parse(Path::new("/data/s3://x")).is_none());
        assert!(is_url(Path::new("s3://b/k")) && !is_url(Path::new("/s3/b")));
        assert_eq!(join_key("a/b/", "c.tar"), "a/b/c.tar");
        assert_eq!(join_key("", "c.tar"), "c.tar");
    }
}
