//! Tests of `stoker bench`'s helpers.

use super::{parse_rate, timed_epochs};

#[test]
fn timed_epochs_last_the_minimum_and_never_fewer_than_asked() {
    // 500 samples at 1000 img/s: 0.5 s an epoch, so 5 s needs 10.
    assert_eq!(timed_epochs(2, 5.0, 1000.0, 500), 10);
    // A long epoch keeps the asked count.
    assert_eq!(timed_epochs(2, 5.0, 1000.0, 100_000), 2);
    assert_eq!(timed_epochs(0, 0.0, 1000.0, 10), 1);
    // A zero rate (every sample bad) or an empty dataset stays bounded.
    assert_eq!(timed_epochs(1, 5.0, 0.0, 10), 1);
    assert_eq!(timed_epochs(1, 5.0, 1e12, 1), 10_000);
}

#[test]
fn parses_the_peers_rate_line() {
    let text = "warming up\nDALI cpu threads=2 batch=64: 1000 images in 1.00s = 912.5 img/s\n";
    assert_eq!(parse_rate(text), Some(912.5));
    assert_eq!(parse_rate("nothing here"), None);
}
