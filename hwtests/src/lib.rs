//! The fabric conformance suite (being written with the transfer engine).
