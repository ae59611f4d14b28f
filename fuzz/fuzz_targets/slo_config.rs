#![no_main]
//! Any text as each key of the slo-controller ConfigMap: parse, field rules, names, overlap.
libfuzzer_sys::fuzz_target!(|text: &[u8]| koord_webhook_fuzz::slo_config(text));
