//! The daemon's Prometheus endpoint read as a scraper reads it: an HTTP GET, a sample's value.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// An HTTP GET of `path` on `addr`; returns (status line, body). The metrics listener starts
/// just after the daemon's socket, so connecting is retried for up to 10 s.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample `series` (name and labels exactly as rendered) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
