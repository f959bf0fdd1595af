//! Listing a prefix page by page (ListObjectsV2), signed as object_store signs its requests,
//! parsed here.
//!
//! # Design
//! object_store's own listing turns each key into its `Path`, and one key it cannot represent
//! (an empty or `..` segment, a control character) fails the page, so one odd key refused a
//! whole dataset. Here every key is kept as the server wrote it; the sample of such a key is a
//! bad sample when it is read (`client::Remote::download` says why), and the rest of the
//! prefix serves. A listing is bounded (`client::Remote::list`): past `max` objects it stops
//! with an error naming the limit, as a folder walk does (`limits.max_index_entries`); a page
//! is read up to [`MAX_PAGE_BYTES`]; at most [`MAX_EMPTY_PAGES`] truncated pages in a row may
//! list nothing, and a continuation token may not come back; the whole listing ends by
//! `s3.list_deadline_ms`; and it stops between pages once the client that asked for it has
//! gone.
//!
//! # Limitations
//! - Requests go to the bucket's endpoint as object_store builds it (path style: endpoint/
//!   bucket; virtual-hosted: the endpoint as given, or AWS's `bucket.s3.region` host).
//! - S3 Express (zonal) endpoints are not supported for listing.

use std::sync::Arc;

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;
use serde::Deserialize;

use super::error::S3Error;

/// The most bytes one ListObjectsV2 page may have: a page of 1,000 keys of the longest
/// (1,024 bytes) takes under 2 MB; past this the page is not read further.
pub(crate) const MAX_PAGE_BYTES: usize = 16 << 20;

/// How many truncated pages in a row may list no object: S3 may send a few (deleted keys
/// under the prefix); a server that sends them without end is refused after this many.
pub(crate) const MAX_EMPTY_PAGES: u32 = 16;

/// One object as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's key in its bucket.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag as listed (changes when the object is rewritten).
    pub etag: String,
}

/// One bucket's listing client.
#[derive(Debug)]
pub(crate) struct Lister {
    s3: Arc<AmazonS3>,
    client: HttpClient,
    /// `https://host/bucket` (path style) or `https://bucket.host` (virtual-hosted).
    base: String,
    region: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    contents: Vec<Content>,
    #[serde(default)]
    next_continuation_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Content {
    key: String,
    size: u64,
    #[serde(rename = "ETag", default)]
    e_tag: Option<String>,
}

impl Lister {
    /// The lister of the bucket `builder` (before its build) names; `s3` is what it built.
    pub(crate) fn new(
        builder: &AmazonS3Builder,
        s3: Arc<AmazonS3>,
        options: &ClientOptions,
        bucket: &str,
    ) -> Result<Lister, S3Error> {
        let url = format!("s3://{bucket}");
        let client = ReqwestConnector::default()
            .connect(options)
            .map_err(|e| S3Error::local(&url, e.to_string()))?;
        let value = |k| builder.get_config_value(&k);
        let region = value(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted =
            value(AmazonS3ConfigKey::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
        let base = match (value(AmazonS3ConfigKey::Endpoint), virtual_hosted) {
            (Some(e), true) => e.trim_end_matches('/').to_owned(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        Ok(Lister {
            s3,
            client,
            base,
            region,
        })
    }

    /// One page of the objects under `prefix`, after `token` (the previous page's); the
    /// next page's token, if there is one. `url` names the listing in errors.
    pub(crate) async fn page(
        &self,
        url: &str,
        prefix: &str,
        token: Option<&str>,
    ) -> Result<(Vec<ObjectInfo>, Option<String>), S3Error> {
        let mut query = format!("list-type=2&prefix={}", encode(prefix));
        if let Some(t) = token {
            query += &format!("&continuation-token={}", encode(t));
        }
        let local = |e: String| S3Error::local(url, e);
        let mut request = http::Request::builder()
            .method("GET")
            .uri(format!("{}?{query}", self.base))
            .body(HttpRequestBody::empty())
            .map_err(|e| local(e.to_string()))?;
        let credential = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| S3Error::of(url, &e))?;
        AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, None);
        let response = (self.client.execute(request).await)
            .map_err(|e| S3Error::connection(url, e.to_string()))?;
        let status = response.status();
        let mut body = Vec::new();
        let mut stream = response.into_body().bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| S3Error::connection(url, e.to_string()))?;
            if body.len() + chunk.len() > MAX_PAGE_BYTES {
                return Err(S3Error::bounded(
                    url,
                    "list_page_too_large",
                    format!(
                        "a listing page is larger than {MAX_PAGE_BYTES} bytes (1,000 keys of \
                         the longest take under 2 MB): reading stopped, refused"
                    ),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(S3Error::of_status(url, status.as_u16(), &text));
        }
        let page: Page = quick_xml::de::from_str(&text)
            .map_err(|e| local(format!("the listing is not ListObjectsV2 XML: {e}")))?;
        let objects = page
            .contents
            .into_iter()
            .map(|c| ObjectInfo {
                key: c.key,
                size: c.size,
                etag: c.e_tag.unwrap_or_default(),
            })
            .collect();
        Ok((objects, page.next_continuation_token))
    }
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved characters), as
/// SigV4's canonical query string wants it.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_keys_object_store_refuses() {
        let xml = "<?xml version=\"1.0\"?><ListBucketResult><Contents><Key>d/a//b.jpg</Key>\
                   <Size>3</Size><ETag>&quot;e&quot;</ETag></Contents><Contents>\
                   <Key>d/c&#x1;.jpg</Key><Size>4</Size></Contents>\
                   <NextContinuationToken>t</NextContinuationToken></ListBucketResult>";
        let page: Page = quick_xml::de::from_str(xml).unwrap();
        let keys: Vec<&str> = page.contents.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, ["d/a//b.jpg", "d/c\u{1}.jpg"]);
        assert_eq!(page.contents[0].e_tag.as_deref(), Some("\"e\""));
        assert_eq!(page.next_continuation_token.as_deref(), Some("t"));
        assert_eq!(encode("a b/ü~"), "a%20b%2F%C3%BC~");
    }
}
