//! Values that mean what they say. The configuration layers hand every setting over as TOML or
//! as text from the environment, and serde's lenient conversions would turn `writers = 4.5` into
//! 4 (or 5), `true` into 1 and `1e30` into a number of milliseconds: a setting the operator
//! did not mean runs silently. These deserializers take a whole number only (an integer, or
//! text of one), and a choice by any case of its name, listing the choices when it is none.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A whole number of type `T`: an integer, or text that is one. A fraction, a boolean, a
/// number out of `T`'s range or other text is refused, saying what was found.
pub(super) fn integer<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + TryFrom<i64>,
{
    deserializer.deserialize_any(WholeNumber(PhantomData))
}

/// [`integer`], for a setting that may be left out.
pub(super) fn optional_integer<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + TryFrom<i64>,
{
    integer(deserializer).map(Some)
}

struct WholeNumber<T>(PhantomData<T>);

impl<T> WholeNumber<T>
where
    T: TryFrom<u64> + TryFrom<i64>,
{
    fn fit<E: de::Error, N: Copy + fmt::Display>(value: N) -> Result<T, E>
    where
        T: TryFrom<N>,
    {
        T::try_from(value).map_err(|_| E::custom(format!("{value} is out of range")))
    }
}

impl<'de, T> Visitor<'de> for WholeNumber<T>
where
    T: TryFrom<u64> + TryFrom<i64>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
        Self::fit(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
        Self::fit(value)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
        Err(E::custom(format!(
            "expected a whole number, found {value} (a fraction is not a count)"
        )))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<T, E> {
        Err(E::custom(format!("expected a whole number, found {value}")))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<T, E> {
        let text = value.trim();
        if let Ok(number) = text.parse::<u64>() {
            return Self::fit(number);
        }
        if let Ok(number) = text.parse::<i64>() {
            return Self::fit(number);
        }
        Err(E::custom(format!(
            "expected a whole number, found `{value}`"
        )))
    }
}

/// A choice among named values, named in any case.
pub(super) trait Choice: Sized + 'static {
    /// Every choice with its name, as the configuration spells it.
    const CHOICES: &'static [(&'static str, Self)];
}

/// A [`Choice`], by its name in any case; otherwise refused, listing the choices.
pub(super) fn choice<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Choice + Copy,
{
    let name = String::deserialize(deserializer)?;
    T::CHOICES
        .iter()
        .find(|(choice, _)| choice.eq_ignore_ascii_case(name.trim()))
        .map(|&(_, value)| value)
        .ok_or_else(|| {
            let names: Vec<&str> = T::CHOICES.iter().map(|(choice, _)| *choice).collect();
            de::Error::custom(format!("`{name}` is not one of {}", names.join(", ")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Counts {
        #[serde(deserialize_with = "integer")]
        writers: usize,
        #[serde(default, deserialize_with = "optional_integer")]
        timeout: Option<u64>,
    }

    /// Through the configuration layers, as the service reads its files.
    fn counts(toml: &str) -> Result<Counts, String> {
        config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|raw| raw.try_deserialize::<Counts>())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn only_whole_numbers_are_counts() {
        assert_eq!(counts("writers = 4").unwrap().writers, 4);
        assert_eq!(counts("writers = \"4\"").unwrap().writers, 4);
        assert_eq!(counts("writers = 4\ntimeout = 5").unwrap().timeout, Some(5));
        for bad in [
            "writers = 4.5",
            "writers = true",
            "writers = \"2.6\"",
            "writers = 1e30",
        ] {
            let err = counts(bad).unwrap_err();
            assert!(err.contains("whole number"), "{bad}: {err}");
        }
        assert!(counts("writers = -1").unwrap_err().contains("out of range"));
    }
}
