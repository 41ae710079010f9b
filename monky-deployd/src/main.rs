//! monky-deployd
fn main() {}
