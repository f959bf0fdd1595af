//! `stoker`: the command-line tool (bench, check, decode, ...).
fn main() {
    eprintln!("stoker: no commands yet");
    std::process::exit(2);
}
