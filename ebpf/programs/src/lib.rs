#![no_std]
// Exists so the agent can declare a build-dependency on this crate (cargo needs a lib target).
