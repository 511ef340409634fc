//! Bounded decoding guard (wire helper).
