//! What the commands share, none of it a command itself: running programs ([`cmd`]), timing a
//! long task's steps ([`steps`]), the workspace and its target directory ([`workspace`]), the
//! tests crate's harness binary ([`harness`]), buf and its API checks ([`buf`]), and a VM as a
//! child process ([`vm`]).

pub mod buf;
pub mod cargo;
pub mod cmd;
pub mod harness;
pub mod steps;
pub mod vm;
pub mod workspace;
