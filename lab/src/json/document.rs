//! What every document shares: its opening ([`About`]: `format`, [`FORMAT_VERSION`],
//! `vkgdr_version`) and its text ([`to_text`]).

use serde::{Deserialize, Serialize};

/// The layout version of every document; raised when a field changes meaning or goes away (new
/// fields may appear without it).
pub const FORMAT_VERSION: u32 = 1;

/// What every document opens with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct About {
    /// Which document: `vkgdr-info`, `vkgdr-bench` or `vkgdr-soak`.
    pub format: String,
    /// [`FORMAT_VERSION`] of the program that wrote it.
    pub format_version: u32,
    /// The version of the `vkgdr` command that wrote it.
    pub vkgdr_version: String,
}

impl About {
    /// The opening of a document of kind `format`, written by this program.
    pub fn new(format: &str) -> About {
        About {
            format: format.to_string(),
            format_version: FORMAT_VERSION,
            vkgdr_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Serializes a document as pretty-printed JSON with a final newline.
pub fn to_text<T: Serialize>(doc: &T) -> String {
    // The documents hold strings, integers, finite floats and options: nothing that can fail.
    let mut text = serde_json::to_string_pretty(doc).expect("documents always serialize");
    text.push('\n');
    text
}
