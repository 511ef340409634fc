//! Golden tests: decode response frames captured from tansu and from librdkafka's conversation
//! with it (see testdata/README.md).
