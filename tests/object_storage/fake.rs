//! A small S3 server on 127.0.0.1 for what SeaweedFS cannot be made to do: stall in the middle
//! of an object's body, and list keys that object_store refuses (`..`, empty segments,
//! control characters). It speaks enough of the S3 REST API for object_store's client:
//! ListObjectsV2 (paginated by `max-keys`, 1000 by default) and whole-object GETs, path-style,
//! over HTTP/1.1 keep-alive; it checks no signature.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which keys stall: their GET sends the headers and half the body, then nothing more while
/// the server lives.
pub(crate) type Stalls = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The server; stops (and lets every stalled connection go) on drop.
pub(crate) struct FakeS3 {
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    /// GETs of objects answered so far (listings not counted).
    gets: Arc<AtomicU64>,
}

struct Bucket {
    name: String,
    objects: BTreeMap<String, Vec<u8>>,
    stalls: Stalls,
}

impl FakeS3 {
    /// Serves `objects` (key -> bytes) as bucket `bucket`; GETs of keys `stalls` names stall.
    pub(crate) fn start(
        bucket: &str,
        objects: BTreeMap<String, Vec<u8>>,
        stalls: Stalls,
    ) -> FakeS3 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let gets = Arc::new(AtomicU64::new(0));
        let bucket = Arc::new(Bucket {
            name: bucket.to_owned(),
            objects,
            stalls,
        });
        let (s, g) = (stop.clone(), gets.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (b, s, g) = (bucket.clone(), s.clone(), g.clone());
                std::thread::spawn(move || serve(conn, &b, &s, &g));
            }
        });
        FakeS3 { port, stop, gets }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn gets(&self) -> u64 {
        self.gets.load(Ordering::Relaxed)
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, bucket: &Bucket, stop: &AtomicBool, gets: &AtomicU64) {
    let mut out = conn.try_clone().unwrap();
    let mut input = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if input.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        // Headers: only their end matters (object_store's GETs and lists have no body).
        loop {
            let mut h = String::new();
            if input.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" || h == "\n" {
                break;
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
            respond(&mut out, 200, "application/xml", &list_xml(bucket, query))
        } else if method == "GET" {
            gets.fetch_add(1, Ordering::Relaxed);
            get(&mut out, bucket, key, stop)
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

/// Answers a GET of `key`: the object, or its first half and then a stall.
fn get(out: &mut TcpStream, bucket: &Bucket, key: &str, stop: &AtomicBool) -> bool {
    let Some(body) = bucket.objects.get(key) else {
        return respond(out, 404, "application/xml", &error_xml("NoSuchKey"));
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\
         ETag: \"{}\"\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n",
        body.len(),
        etag(body)
    );
    if !(bucket.stalls)(key) {
        return out.write_all(head.as_bytes()).is_ok() && out.write_all(body).is_ok();
    }
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(&body[..body.len() / 2]);
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
    let keys: Vec<(&String, &Vec<u8>)> = bucket
        .objects
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
    xml + "</ListBucketResult>"
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
