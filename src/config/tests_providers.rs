//! Unit tests of `[providers.<name>]`: parsing, checks, secrets.
