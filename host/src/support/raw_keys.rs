//! Tables whose keys are shared out among owners: a plugin's table holds
//! its own keys and each capability's, and each owner declares and reads
//! its own ([`raw_keys!`](crate::raw_keys)). A table's deserializer hands
//! each key's value to the owner that [`takes`](RawKeys::take) it, read
//! by the real deserializer, so positions (`toml::Spanned`) survive;
//! a key nobody takes is the table's to refuse.

use serde::de::MapAccess;

/// The keys one owner reads from a table, each value an `Option` (absent
/// until its key is read).
pub trait RawKeys: Default {
    /// The keys it reads.
    fn keys() -> &'static [&'static str];

    /// Reads the value of `key` from `map` if `key` is one of its own;
    /// `false` if not (the value is left unread).
    fn take<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;
}

/// No keys: a capability the table grants nothing of.
#[derive(Debug, Default)]
pub struct NoKeys;

impl RawKeys for NoKeys {
    fn keys() -> &'static [&'static str] {
        &[]
    }

    fn take<'de, A: MapAccess<'de>>(&mut self, _: &str, _: &mut A) -> Result<bool, A::Error> {
        Ok(false)
    }
}

/// Declares a struct of keys: each field `name: Type = "key"` becomes
/// `Option<Type>`, read when the table has `key`.
///
/// ```
/// baton::raw_keys! {
///     /// The keys of an example.
///     pub struct Example {
///         /// `send-buffer`.
///         pub send_buffer: u64 = "send-buffer",
///     }
/// }
/// use baton::support::raw_keys::RawKeys;
/// assert_eq!(Example::keys(), ["send-buffer"]);
/// ```
#[macro_export]
macro_rules! raw_keys {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$field_meta:meta])* $field_vis:vis $field:ident: $ty:ty = $key:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$field_meta])* $field_vis $field: Option<$ty>, )*
        }

        impl $crate::support::raw_keys::RawKeys for $name {
            fn keys() -> &'static [&'static str] {
                &[$($key),*]
            }

            fn take<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                match key {
                    $( $key => {
                        self.$field = Some(map.next_value()?);
                        Ok(true)
                    } )*
                    _ => Ok(false),
                }
            }
        }
    };
}
