//! A test component that is not a baton plugin: a plain `wasi:cli/command`
//! (it exports `wasi:cli/run`, not a baton task), for the host's checks.

fn main() {
    println!("not a plugin");
}
