//! Placeholder scaffold
fn main() {}
