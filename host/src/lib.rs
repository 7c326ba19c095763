//! `rolex-host`: the transfer engine and its domains (being written).
