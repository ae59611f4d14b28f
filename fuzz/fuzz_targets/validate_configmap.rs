#![no_main]
//! Any body sent to the endpoint below: decode, chain, response.
libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    koord_webhook_fuzz::review(
        koord_webhook::entries::EndpointName::ValidateConfigMap,
        body,
    )
});
