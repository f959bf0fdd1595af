//! A failed S3 request ([`S3Error`]): its URL, the S3 error code and what kind of failure it
//! is, read from what object_store reports (the response body it keeps in its message, else
//! the HTTP status, else `connection`).

#![forbid(unsafe_code)]

use std::path::Path;
use std::time::Duration;

/// What kind of failure an S3 request met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3ErrorKind {
    /// No such key or bucket.
    NotFound,
    /// Access denied or bad credentials.
    Permission,
    /// The object is not the one indexed: another ETag or size (replaced since it was
    /// listed), or a body longer than it.
    Changed,
    /// Anything else: the server is down, a timeout, a 5xx after every retry, a local error.
    Other,
}

/// A failed S3 request: the URL, the S3 error code (`NoSuchKey`, `SignatureDoesNotMatch`,
/// `InvalidAccessKeyId`, `NoSuchBucket`, `SlowDown`, or `HTTP <status>` / `connection` when the
/// server said nothing better) and the message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{url}: S3 error {code}: {message}")]
pub struct S3Error {
    /// The object or listing asked for.
    pub url: String,
    /// The failure's kind (what a bad sample is counted as).
    pub kind: S3ErrorKind,
    /// The S3 error code, or `HTTP <status>`, `connection` or `local`.
    pub code: String,
    /// The server's message, or what failed locally.
    pub message: String,
}

impl S3Error {
    /// A failure on this side (code `local`, kind [`S3ErrorKind::Other`]).
    pub fn local(url: &str, message: String) -> S3Error {
        S3Error {
            url: url.to_owned(),
            kind: S3ErrorKind::Other,
            code: "local".into(),
            message,
        }
    }

    /// An answer for another object than the one indexed (`code`: `etag_mismatch`,
    /// `size_mismatch`): kind [`S3ErrorKind::Changed`], never retried.
    pub fn changed(url: &str, code: &str, message: String) -> S3Error {
        S3Error {
            url: url.to_owned(),
            kind: S3ErrorKind::Changed,
            code: code.into(),
            message,
        }
    }

    /// A listing or download refused by its bounds (`code` names which: a page too large,
    /// pages without objects, the deadline, the client gone, a stalled answer): never
    /// retried.
    pub fn bounded(url: &str, code: &str, message: String) -> S3Error {
        S3Error {
            url: url.to_owned(),
            kind: S3ErrorKind::Other,
            code: code.into(),
            message,
        }
    }

    /// A fetch that did not end within its whole-request deadline.
    pub fn timeout(url: &str, deadline: Duration) -> S3Error {
        S3Error {
            url: url.to_owned(),
            kind: S3ErrorKind::Other,
            code: "timeout".into(),
            message: format!(
                "not fetched within the {} ms deadline (s3.fetch_deadline_ms)",
                deadline.as_millis()
            ),
        }
    }

    /// A local write that failed: `disk_full` when the disk is, else `local`.
    pub(super) fn write(url: &str, file: &Path, e: &std::io::Error) -> S3Error {
        let mut err = S3Error::local(url, format!("{}: {e}", file.display()));
        if e.kind() == std::io::ErrorKind::StorageFull {
            err.code = "disk_full".into();
        }
        err
    }

    /// Whether a local write found the disk full (the node cache then makes room).
    pub fn is_disk_full(&self) -> bool {
        self.code == "disk_full"
    }

    pub(super) fn of(url: &str, e: &object_store::Error) -> S3Error {
        let text = format!("{e}");
        let debug = format!("{e:?}");
        let code = xml_code(&text)
            .or_else(|| xml_code(&debug))
            .or_else(|| http_status(&text).map(|s| format!("HTTP {s}")))
            .unwrap_or_else(|| match e {
                object_store::Error::NotFound { .. } => "NoSuchKey".into(),
                object_store::Error::PermissionDenied { .. } => "AccessDenied".into(),
                object_store::Error::Unauthenticated { .. } => "Unauthenticated".into(),
                object_store::Error::Precondition { .. } => "PreconditionFailed".into(),
                _ if looks_like_connection(&debug) => "connection".into(),
                _ => "unknown".into(),
            });
        let kind = match e {
            object_store::Error::NotFound { .. } => S3ErrorKind::NotFound,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => S3ErrorKind::Permission,
            object_store::Error::Precondition { .. } => S3ErrorKind::Changed,
            _ => kind_of_code(&code),
        };
        S3Error {
            url: url.to_owned(),
            kind,
            code,
            message: text,
        }
    }

    /// A response with a failure `status` and `body` (the S3 error XML, usually).
    pub(super) fn of_status(url: &str, status: u16, body: &str) -> S3Error {
        let code = xml_code(body).unwrap_or_else(|| format!("HTTP {status}"));
        let kind = match status {
            404 => S3ErrorKind::NotFound,
            401 | 403 => S3ErrorKind::Permission,
            412 => S3ErrorKind::Changed,
            _ => kind_of_code(&code),
        };
        S3Error {
            url: url.to_owned(),
            kind,
            code,
            message: format!("status {status}: {body}"),
        }
    }

    /// A request that got no answer (refused, reset, timed out).
    pub(super) fn connection(url: &str, message: String) -> S3Error {
        S3Error {
            url: url.to_owned(),
            kind: S3ErrorKind::Other,
            code: "connection".into(),
            message,
        }
    }

    /// Whether trying again may help: throttling, 5xx, timeouts, connection errors.
    pub(super) fn retryable(&self) -> bool {
        if self.kind != S3ErrorKind::Other {
            return false;
        }
        match self.code.strip_prefix("HTTP ") {
            Some(status) => status.starts_with('5') || status == "429" || status == "408",
            None => !matches!(
                self.code.as_str(),
                "NoSuchBucket"
                    | "InvalidBucketName"
                    | "InvalidAccessKeyId"
                    | "local"
                    | "disk_full"
                    | "timeout"
                    | "bad_key"
                    | "list_page_too_large"
                    | "list_no_progress"
                    | "list_deadline"
                    | "client_gone"
                    | "stalled"
            ),
        }
    }
}

/// The kind of failure an S3 error code names.
fn kind_of_code(code: &str) -> S3ErrorKind {
    if code == "NoSuchKey" || code == "NoSuchBucket" {
        S3ErrorKind::NotFound
    } else if code == "AccessDenied" || code.contains("Signature") || code.contains("AccessKey") {
        S3ErrorKind::Permission
    } else {
        S3ErrorKind::Other
    }
}

/// The text of the first `<Code>...</Code>` in `s`.
fn xml_code(s: &str) -> Option<String> {
    let start = s.find("<Code>")? + "<Code>".len();
    let end = s[start..].find("</Code>")? + start;
    Some(s[start..end].to_owned()).filter(|c| !c.is_empty() && c.len() < 64)
}

/// The HTTP status in object_store's message (`... status 503 Service Unavailable ...`).
fn http_status(s: &str) -> Option<String> {
    let at = s.find("status ")? + "status ".len();
    let digits: String = s[at..].chars().take_while(char::is_ascii_digit).collect();
    (digits.len() == 3).then_some(digits)
}

fn looks_like_connection(debug: &str) -> bool {
    let d = debug.to_ascii_lowercase();
    [
        "connect",
        "timed out",
        "timeout",
        "reset",
        "broken pipe",
        "sending request",
    ]
    .iter()
    .any(|w| d.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_come_from_the_xml_body_or_the_status() {
        let body = "Client error with status 403 Forbidden: <?xml version=\"1.0\"?><Error>\
                    <Code>SignatureDoesNotMatch</Code><Message>x</Message></Error>";
        assert_eq!(xml_code(body).as_deref(), Some("SignatureDoesNotMatch"));
        assert_eq!(http_status(body).as_deref(), Some("403"));
        assert_eq!(xml_code("no code here"), None);
        assert_eq!(
            http_status("Server error with status 503 x").as_deref(),
            Some("503")
        );
    }
}
