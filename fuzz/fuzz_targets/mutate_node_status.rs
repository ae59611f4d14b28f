#![no_main]
// Any body sent to MUTATE_NODE_STATUS: decode, chain, response.
libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    koord_webhook_fuzz::review(koord_webhook::admission::webhooks::MUTATE_NODE_STATUS, body)
});
