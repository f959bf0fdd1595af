//! The status codes of NVIDIA's libraries as named newtypes, one macro for all three.
//!
//! # Design
//! A status is named from a table written here, without asking the library (it may be the
//! thing that failed); `Debug` and `Display` print `NAME (code)`. Each code is written once:
//! its constant and its name come from the same row.
//!
//! # Limitations
//! Only the codes stoker can meet are named; any other prints as the library's `(unnamed)`.

/// Defines a status newtype over the library's raw code: a constant and a name per row,
/// [`name`](#method.name), `Debug`/`Display` as `NAME (code)` and `result` (`Ok` for 0, the
/// library's success).
#[macro_export]
macro_rules! status_type {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($raw:ty), unnamed $unnamed:literal {
            $( $konst:ident = $code:literal => $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        $vis struct $name(
            /// The raw code the library returned.
            $vis $raw,
        );

        impl $name {
            $(
                #[doc = concat!("`", $text, "`.")]
                $vis const $konst: $name = $name($code);
            )*

            /// The library's name for this status.
            $vis fn name(self) -> &'static str {
                match self.0 {
                    $( $code => $text, )*
                    _ => $unnamed,
                }
            }

            /// `Ok` for success (0), else this status.
            $vis fn result(self) -> Result<(), $name> {
                if self.0 == 0 {
                    Ok(())
                } else {
                    Err(self)
                }
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{} ({})", self.name(), self.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(self, f)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::status_type! {
        /// A status for the test.
        pub(super) struct TestStatus(i32), unnamed "TEST_(unnamed)" {
            SUCCESS = 0 => "TEST_SUCCESS",
            BROKEN = 7 => "TEST_BROKEN",
        }
    }

    #[test]
    fn statuses_are_named_printed_and_turned_into_results() {
        assert_eq!(TestStatus::BROKEN.name(), "TEST_BROKEN");
        assert_eq!(TestStatus(3).name(), "TEST_(unnamed)");
        assert_eq!(TestStatus::BROKEN.to_string(), "TEST_BROKEN (7)");
        assert_eq!(format!("{:?}", TestStatus(3)), "TEST_(unnamed) (3)");
        assert_eq!(TestStatus::SUCCESS.result(), Ok(()));
        assert_eq!(TestStatus(7).result(), Err(TestStatus::BROKEN));
    }
}
