//! monky-deployd's integration tests: the real binary against the testkit peers and a stub
//! docker, one module per concern.

mod util;

mod apply;
mod bundle_check;
mod cli;
mod crash;
mod lifecycle;
mod redaction;
mod token;
mod transport;
