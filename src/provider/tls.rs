//! (being written: issue 20)
