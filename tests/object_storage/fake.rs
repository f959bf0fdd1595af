//! A small S3 server on 127.0.0.1 for what SeaweedFS cannot be made to do: stall in the middle
//! of an object's body, list keys that object_store refuses (`..`, empty segments, control
//! characters), replace an object between its listing and its GET while ignoring If-Match,
//! send a body far larger than the object it lists, list without end. It speaks enough of the
//! S3 REST API for object_store's client: ListObjectsV2 (paginated by `max-keys`, 1000 by
//! default) and GETs (whole, or one `Range: bytes=a-b`; `If-Match` answered with 412 as S3
//! does, unless told to ignore it), path-style, over HTTP/1.1 keep-alive; it checks no
//! signature.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Which keys stall: their GET sends the headers and half the body, then nothing more while
/// the server lives.
pub(crate) type Stalls = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How the server misbehaves; the default behaves.
#[derive(Clone, Default)]
pub(crate) struct Behaviour {
    /// Keys whose GET stalls halfway through the body.
    pub(crate) stalls: Option<Stalls>,
    /// Serves what it holds whatever `If-Match` says (a server without conditional reads).
    pub(crate) ignores_if_match: bool,
    /// Every GET of an object answers this many bytes (`Content-Length` saying so, and a
    /// `Content-Range` of the range asked for), whatever the object's listed size.
    pub(crate) oversized_body: Option<u64>,
    /// How ListObjectsV2 answers.
    pub(crate) listing: Listing,
    /// How long the server waits before answering each ListObjectsV2 page.
    pub(crate) list_delay: Duration,
}

/// How the server lists.
#[derive(Clone, Copy, Default)]
pub(crate) enum Listing {
    /// The objects it holds, 1,000 a page.
    #[default]
    Honest,
    /// Every page is empty and truncated, with a new continuation token.
    EmptyPagesForever,
    /// Every page lists one new object and is truncated: a listing that never ends.
    OneObjectPagesForever,
    /// The honest pages, each padded with spaces to this many bytes.
    PaddedTo(usize),
}

/// The server; stops (and lets every stalled connection go) on drop.
pub(crate) struct FakeS3 {
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    bucket: Arc<Bucket>,
}

struct Bucket {
    name: String,
    objects: RwLock<BTreeMap<String, Vec<u8>>>,
    behaviour: Behaviour,
    /// GETs of objects answered so far (listings not counted).
    gets: AtomicU64,
    /// ListObjectsV2 requests answered so far.
    lists: AtomicU64,
    /// Bytes of GET bodies written to clients so far.
    body_bytes: AtomicU64,
}

/// A request's headers that the server looks at.
#[derive(Default)]
struct Headers {
    range: Option<(u64, u64)>,
    if_match: Option<String>,
}

impl FakeS3 {
    /// Serves `objects` (key -> bytes) as bucket `bucket`; GETs of keys `stalls` names stall.
    pub(crate) fn start(
        bucket: &str,
        objects: BTreeMap<String, Vec<u8>>,
        stalls: Stalls,
    ) -> FakeS3 {
        let behaviour = Behaviour {
            stalls: Some(stalls),
            ..Behaviour::default()
        };
        FakeS3::start_with(bucket, objects, behaviour)
    }

    /// Serves `objects` (key -> bytes) as bucket `bucket`, misbehaving as `behaviour` says.
    pub(crate) fn start_with(
        bucket: &str,
        objects: BTreeMap<String, Vec<u8>>,
        behaviour: Behaviour,
    ) -> FakeS3 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let bucket = Arc::new(Bucket {
            name: bucket.to_owned(),
            objects: RwLock::new(objects),
            behaviour,
            gets: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
        });
        let (s, b) = (stop.clone(), bucket.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (b, s) = (b.clone(), s.clone());
                std::thread::spawn(move || serve(conn, &b, &s));
            }
        });
        FakeS3 { port, stop, bucket }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// GETs of objects answered so far.
    pub(crate) fn gets(&self) -> u64 {
        self.bucket.gets.load(Ordering::Relaxed)
    }

    /// ListObjectsV2 requests answered so far.
    #[allow(dead_code)]
    pub(crate) fn lists(&self) -> u64 {
        self.bucket.lists.load(Ordering::Relaxed)
    }

    /// Bytes of GET bodies the server wrote so far.
    #[allow(dead_code)]
    pub(crate) fn body_bytes(&self) -> u64 {
        self.bucket.body_bytes.load(Ordering::Relaxed)
    }

    /// Replaces the bytes of `key` (a new ETag with them); later GETs serve them, listings
    /// list them.
    #[allow(dead_code)]
    pub(crate) fn replace(&self, key: &str, bytes: Vec<u8>) {
        let mut objects = self.bucket.objects.write().unwrap();
        assert!(objects.contains_key(key), "no object {key} to replace");
        objects.insert(key.to_owned(), bytes);
    }

    /// The bytes of `key` as served now.
    #[allow(dead_code)]
    pub(crate) fn object(&self, key: &str) -> Vec<u8> {
        self.bucket.objects.read().unwrap()[key].clone()
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, bucket: &Bucket, stop: &AtomicBool) {
    let mut out = conn.try_clone().unwrap();
    let mut input = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if input.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        // Headers: Range and If-Match matter (object_store's GETs and lists have no body).
        let mut headers = Headers::default();
        loop {
            let mut h = String::new();
            if input.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" || h == "\n" {
                break;
            }
            let Some((name, value)) = h.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("range") {
                headers.range = value
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            } else if name.eq_ignore_ascii_case("if-match") {
                headers.if_match = Some(value.to_owned());
            }
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let path = decode(path.trim_start_matches('/'));
        let (name, key) = path.split_once('/').unwrap_or((&path, ""));
        let ok = if name != bucket.name {
            respond(&mut out, 404, "application/xml", &error_xml("NoSuchBucket"))
        } else if key.is_empty() && method == "GET" {
            bucket.lists.fetch_add(1, Ordering::Relaxed);
            respond(&mut out, 200, "application/xml", &list_xml(bucket, query))
        } else if method == "GET" {
            bucket.gets.fetch_add(1, Ordering::Relaxed);
            get(&mut out, bucket, key, &headers, stop)
        } else {
            respond(
                &mut out,
                501,
                "application/xml",
                &error_xml("NotImplemented"),
            )
        };
        if !ok {
            return;
        }
    }
}

/// Answers a GET of `key` (`headers`: its range and If-Match): the object or the range asked
/// for; its first half and then a stall; or a body of the oversized length.
fn get(
    out: &mut TcpStream,
    bucket: &Bucket,
    key: &str,
    headers: &Headers,
    stop: &AtomicBool,
) -> bool {
    let Some(body) = bucket.objects.read().unwrap().get(key).cloned() else {
        return respond(out, 404, "application/xml", &error_xml("NoSuchKey"));
    };
    let tag = etag(&body);
    if let Some(m) = &headers.if_match {
        if !bucket.behaviour.ignores_if_match && m.trim_matches('"') != tag {
            return respond(
                out,
                412,
                "application/xml",
                &error_xml("PreconditionFailed"),
            );
        }
    }
    let total = body.len() as u64;
    let (status, range) = match headers.range {
        Some((a, b)) if a <= b && a < total => ("206 Partial Content", a..(b + 1).min(total)),
        _ => ("200 OK", 0..total),
    };
    let mut length = range.end - range.start;
    if let Some(n) = bucket.behaviour.oversized_body {
        length = n;
    }
    let content_range = if headers.range.is_some() {
        format!(
            "Content-Range: bytes {}-{}/{total}\r\n",
            range.start,
            range.end - 1
        )
    } else {
        String::new()
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {length}\r\n{content_range}Content-Type: \
         application/octet-stream\r\nETag: \"{tag}\"\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 \
         GMT\r\n\r\n"
    );
    if out.write_all(head.as_bytes()).is_err() {
        return false;
    }
    let part = &body[range.start as usize..range.end as usize];
    if bucket.behaviour.oversized_body.is_some() {
        // The object's bytes, then zeros to the length claimed, for as long as the client reads.
        let mut sent = 0u64;
        let zeros = vec![0u8; 64 << 10];
        while sent < length {
            let chunk: &[u8] = if sent == 0 { part } else { &zeros };
            let n = chunk.len().min((length - sent) as usize);
            if out.write_all(&chunk[..n]).is_err() {
                return false;
            }
            sent += n as u64;
            bucket.body_bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        return true;
    }
    if !bucket.behaviour.stalls.as_ref().is_some_and(|s| s(key)) {
        let ok = out.write_all(part).is_ok();
        if ok {
            bucket
                .body_bytes
                .fetch_add(part.len() as u64, Ordering::Relaxed);
        }
        return ok;
    }
    let _ = out.write_all(&part[..part.len() / 2]);
    let _ = out.flush();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn respond(out: &mut TcpStream, status: u16, kind: &str, body: &str) -> bool {
    let text = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: {kind}\r\n\r\n{body}",
        body.len()
    );
    out.write_all(text.as_bytes()).is_ok()
}

fn error_xml(code: &str) -> String {
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{code}</Message></Error>")
}

/// A ListObjectsV2 page: keys under `prefix` after the continuation token (the last key of
/// the previous page), at most `max-keys` of them.
fn list_xml(bucket: &Bucket, query: &str) -> String {
    let arg = |name: &str| {
        query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| decode(v))
        })
    };
    let prefix = arg("prefix").unwrap_or_default();
    let after = arg("continuation-token").or_else(|| arg("start-after"));
    let max: usize = arg("max-keys").and_then(|m| m.parse().ok()).unwrap_or(1000);
    let n = bucket.lists.load(Ordering::Relaxed);
    std::thread::sleep(bucket.behaviour.list_delay);
    match bucket.behaviour.listing {
        Listing::EmptyPagesForever => {
            return format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{}</Name>\
                 <KeyCount>0</KeyCount><MaxKeys>{max}</MaxKeys><IsTruncated>true</IsTruncated>\
                 <NextContinuationToken>page-{n}</NextContinuationToken></ListBucketResult>",
                bucket.name
            )
        }
        Listing::OneObjectPagesForever => {
            return format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{}</Name>\
                 <KeyCount>1</KeyCount><MaxKeys>{max}</MaxKeys><IsTruncated>true</IsTruncated>\
                 <Contents><Key>{}{n:012}.jpg</Key><Size>3</Size><ETag>&quot;e{n}&quot;</ETag>\
                 </Contents><NextContinuationToken>page-{n}</NextContinuationToken>\
                 </ListBucketResult>",
                bucket.name,
                escape(&prefix)
            )
        }
        Listing::Honest | Listing::PaddedTo(_) => {}
    }
    let objects = bucket.objects.read().unwrap();
    let keys: Vec<(&String, &Vec<u8>)> = objects
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter(|(k, _)| after.as_ref().is_none_or(|a| k.as_str() > a.as_str()))
        .take(max + 1)
        .collect();
    let truncated = keys.len() > max;
    let mut xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{}</Name>\
         <Prefix>{}</Prefix><KeyCount>{}</KeyCount><MaxKeys>{max}</MaxKeys>\
         <IsTruncated>{truncated}</IsTruncated>",
        bucket.name,
        escape(&prefix),
        keys.len().min(max)
    );
    for (k, body) in keys.iter().take(max) {
        xml += &format!(
            "<Contents><Key>{}</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>\
             <ETag>&quot;{}&quot;</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass>\
             </Contents>",
            escape(k),
            etag(body),
            body.len()
        );
    }
    if truncated {
        let last = keys[max - 1].0;
        xml += &format!(
            "<NextContinuationToken>{}</NextContinuationToken>",
            escape(last)
        );
    }
    xml += "</ListBucketResult>";
    if let Listing::PaddedTo(size) = bucket.behaviour.listing {
        let pad = size.saturating_sub(xml.len());
        xml.insert_str(xml.len() - "</ListBucketResult>".len(), &" ".repeat(pad));
    }
    xml
}

fn etag(body: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in body {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// XML text: the five entities, and control characters as character references (as S3
/// writes them).
fn escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' => out += "&quot;",
            '\'' => out += "&apos;",
            c if c.is_control() => out += &format!("&#x{:x};", u32::from(c)),
            c => out.push(c),
        }
    }
    out
}

/// Percent-decoding of a URL path or query value (`+` is a space in a query).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
