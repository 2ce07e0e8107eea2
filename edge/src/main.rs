//! The `querylayer` command: the edge service and the operator tools.

fn main() {
    eprintln!("querylayer: the edge is not built yet");
    std::process::exit(2);
}
