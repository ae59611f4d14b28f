#![no_main]
//! Any two JSON documents (split at the first NUL) as a pod and a strategic merge patch.
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| koord_webhook_fuzz::strategic_merge(bytes));
