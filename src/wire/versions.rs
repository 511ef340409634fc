//! Version negotiation (wire helper).
