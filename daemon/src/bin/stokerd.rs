//! `stokerd`: the stoker daemon.
fn main() {
    eprintln!("stokerd: the server is not built yet");
    std::process::exit(2);
}
