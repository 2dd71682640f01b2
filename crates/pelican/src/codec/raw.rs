//! [`Raw`]: bodies that are bytes already, sent as they are.

use super::{Codec, CodecError};
use serde::de::{self, DeserializeOwned, Visitor};
use serde::ser::{self, Impossible, Serialize};

/// Bodies as raw bytes, no encoding: for requests and responses that are bytes already
/// (images, block inputs, model tensors, a format of your own). One copy each way, no
/// escaping, no parsing: what a large body needs.
///
/// Values that serialize as bytes or as a string: [`bytes::Bytes`] (re-exported as
/// [`crate::Bytes`]), `serde_bytes::ByteBuf`, `String`, and `Vec<u8>` (which serde treats
/// as a sequence of numbers: correct, but a byte at a time, so prefer `Bytes` for large
/// bodies). Anything else (a struct, a number) is refused with a [`CodecError`]. A
/// `String` is decoded only from valid UTF-8.
///
/// ```
/// use pelican::{Bytes, Codec, Raw};
/// let body = Raw::encode(&Bytes::from_static(b"\x00\x01 any bytes")).unwrap();
/// assert_eq!(body, b"\x00\x01 any bytes");
/// let back: Bytes = Raw::decode(&body).unwrap();
/// assert_eq!(&back[..], b"\x00\x01 any bytes");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Codec for Raw {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
        value.serialize(RawSerializer)
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
        T::deserialize(RawDeserializer(bytes))
    }

    /// `Bytes`, `ByteBuf` and `String` take the body over: no copy.
    fn decode_owned<T: DeserializeOwned>(bytes: Vec<u8>) -> Result<T, CodecError> {
        T::deserialize(RawDeserializer(bytes))
    }
}

impl ser::Error for CodecError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CodecError(msg.to_string())
    }
}

impl de::Error for CodecError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CodecError(msg.to_string())
    }
}

fn refused(what: &str) -> CodecError {
    CodecError(format!(
        "the Raw codec carries bytes or strings only, not {what} (use Bytes, ByteBuf, String or Vec<u8>)"
    ))
}

struct RawSerializer;

/// Collects a `Vec<u8>`'s elements.
struct ByteSeq(Vec<u8>);

struct ByteOnly;

impl ser::Serializer for ByteOnly {
    type Ok = u8;
    type Error = CodecError;
    type SerializeSeq = Impossible<u8, CodecError>;
    type SerializeTuple = Impossible<u8, CodecError>;
    type SerializeTupleStruct = Impossible<u8, CodecError>;
    type SerializeTupleVariant = Impossible<u8, CodecError>;
    type SerializeMap = Impossible<u8, CodecError>;
    type SerializeStruct = Impossible<u8, CodecError>;
    type SerializeStructVariant = Impossible<u8, CodecError>;

    fn serialize_u8(self, v: u8) -> Result<u8, CodecError> {
        Ok(v)
    }
    refuse_all_but_u8!();
}

impl ser::SerializeSeq for ByteSeq {
    type Ok = Vec<u8>;
    type Error = CodecError;
    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CodecError> {
        self.0.push(value.serialize(ByteOnly)?);
        Ok(())
    }
    fn end(self) -> Result<Vec<u8>, CodecError> {
        Ok(self.0)
    }
}

impl ser::Serializer for RawSerializer {
    type Ok = Vec<u8>;
    type Error = CodecError;
    type SerializeSeq = ByteSeq;
    type SerializeTuple = Impossible<Vec<u8>, CodecError>;
    type SerializeTupleStruct = Impossible<Vec<u8>, CodecError>;
    type SerializeTupleVariant = Impossible<Vec<u8>, CodecError>;
    type SerializeMap = Impossible<Vec<u8>, CodecError>;
    type SerializeStruct = Impossible<Vec<u8>, CodecError>;
    type SerializeStructVariant = Impossible<Vec<u8>, CodecError>;

    fn serialize_bytes(self, v: &[u8]) -> Result<Vec<u8>, CodecError> {
        Ok(v.to_vec())
    }
    fn serialize_str(self, v: &str) -> Result<Vec<u8>, CodecError> {
        Ok(v.as_bytes().to_vec())
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<ByteSeq, CodecError> {
        Ok(ByteSeq(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Vec<u8>, CodecError> {
        value.serialize(self)
    }
    fn serialize_u8(self, _v: u8) -> Result<Vec<u8>, CodecError> {
        Err(refused("a number"))
    }
    refuse_rest!(Vec<u8>);
}

/// The `Serializer` methods neither serializer takes: each refuses with its kind.
macro_rules! refuse_common {
    ($ok:ty) => {
        fn serialize_bool(self, _v: bool) -> Result<$ok, CodecError> {
            Err(refused("a bool"))
        }
        fn serialize_i8(self, _v: i8) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_i16(self, _v: i16) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_i32(self, _v: i32) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_i64(self, _v: i64) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_u16(self, _v: u16) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_u32(self, _v: u32) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_u64(self, _v: u64) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_f32(self, _v: f32) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_f64(self, _v: f64) -> Result<$ok, CodecError> {
            Err(refused("a number"))
        }
        fn serialize_char(self, _v: char) -> Result<$ok, CodecError> {
            Err(refused("a char"))
        }
        fn serialize_none(self) -> Result<$ok, CodecError> {
            Err(refused("an option"))
        }
        fn serialize_some<T: ?Sized + Serialize>(self, _v: &T) -> Result<$ok, CodecError> {
            Err(refused("an option"))
        }
        fn serialize_unit(self) -> Result<$ok, CodecError> {
            Err(refused("()"))
        }
        fn serialize_unit_struct(self, _n: &'static str) -> Result<$ok, CodecError> {
            Err(refused("a unit struct"))
        }
        fn serialize_unit_variant(
            self,
            _n: &'static str,
            _i: u32,
            _v: &'static str,
        ) -> Result<$ok, CodecError> {
            Err(refused("an enum"))
        }
        fn serialize_newtype_variant<T: ?Sized + Serialize>(
            self,
            _n: &'static str,
            _i: u32,
            _v: &'static str,
            _value: &T,
        ) -> Result<$ok, CodecError> {
            Err(refused("an enum"))
        }
        fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, CodecError> {
            Err(refused("a tuple"))
        }
        fn serialize_tuple_struct(
            self,
            _n: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleStruct, CodecError> {
            Err(refused("a tuple struct"))
        }
        fn serialize_tuple_variant(
            self,
            _n: &'static str,
            _i: u32,
            _v: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleVariant, CodecError> {
            Err(refused("an enum"))
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, CodecError> {
            Err(refused("a map"))
        }
        fn serialize_struct(
            self,
            _n: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStruct, CodecError> {
            Err(refused("a struct"))
        }
        fn serialize_struct_variant(
            self,
            _n: &'static str,
            _i: u32,
            _v: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStructVariant, CodecError> {
            Err(refused("an enum"))
        }
    };
}
use refuse_common;

macro_rules! refuse_rest {
    ($ok:ty) => {
        refuse_common!($ok);
    };
}
use refuse_rest;

macro_rules! refuse_all_but_u8 {
    () => {
        refuse_common!(u8);
        fn serialize_bytes(self, _v: &[u8]) -> Result<u8, CodecError> {
            Err(refused("bytes in a sequence"))
        }
        fn serialize_str(self, _v: &str) -> Result<u8, CodecError> {
            Err(refused("a string in a sequence"))
        }
        fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, CodecError> {
            Err(refused("a nested sequence"))
        }
        fn serialize_newtype_struct<T: ?Sized + Serialize>(
            self,
            _name: &'static str,
            _value: &T,
        ) -> Result<u8, CodecError> {
            Err(refused("a newtype in a sequence"))
        }
    };
}
use refuse_all_but_u8;

/// How a body is handed to a value's visitor: borrowed (`decode`: copied where the value
/// keeps bytes of its own) or owned (`decode_owned`: taken over).
trait Body: Sized {
    fn bytes<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError>;
    fn byte_buf<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError>;
    fn string<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError>;
    fn seq<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError>;
}

fn not_utf8(e: std::str::Utf8Error) -> CodecError {
    CodecError(format!("the body is not UTF-8: {e}"))
}

impl Body for &[u8] {
    fn bytes<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_bytes(self)
    }
    fn byte_buf<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_byte_buf(self.to_vec())
    }
    fn string<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_str(std::str::from_utf8(self).map_err(not_utf8)?)
    }
    fn seq<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_seq(de::value::SeqDeserializer::new(self.iter().copied()))
    }
}

impl Body for Vec<u8> {
    fn bytes<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_byte_buf(self)
    }
    fn byte_buf<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_byte_buf(self)
    }
    fn string<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_string(String::from_utf8(self).map_err(|e| not_utf8(e.utf8_error()))?)
    }
    fn seq<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, CodecError> {
        v.visit_seq(de::value::SeqDeserializer::new(self.into_iter()))
    }
}

/// Offers the body as bytes (or, asked for a string, as UTF-8; asked for a sequence,
/// as its bytes one by one: `Vec<u8>`).
struct RawDeserializer<B>(B);

impl<'de, B: Body> de::Deserializer<'de> for RawDeserializer<B> {
    type Error = CodecError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.bytes(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.bytes(visitor)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.byte_buf(visitor)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.string(visitor)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.string(visitor)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.0.seq(visitor)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char option unit
        unit_struct tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn bytes_strings_and_vectors_round_trip_unchanged() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(Raw::encode(&Bytes::from(all.clone())).unwrap(), all);
        assert_eq!(Raw::decode::<Bytes>(&all).unwrap(), all);
        assert_eq!(Raw::encode(&all).unwrap(), all);
        assert_eq!(Raw::decode::<Vec<u8>>(&all).unwrap(), all);
        assert_eq!(
            Raw::encode(&"héllo".to_string()).unwrap(),
            "héllo".as_bytes()
        );
        assert_eq!(Raw::decode::<String>("héllo".as_bytes()).unwrap(), "héllo");
        assert_eq!(Raw::encode(&Bytes::new()).unwrap(), b"");
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        #[derive(serde::Serialize, serde::Deserialize, Debug)]
        struct S {
            a: u32,
        }
        let e = Raw::encode(&S { a: 1 }).unwrap_err();
        assert!(e.0.contains("not a struct"), "{e}");
        assert!(Raw::encode(&7u32).unwrap_err().0.contains("number"));
        assert!(Raw::decode::<S>(b"{}").is_err());
        assert!(Raw::decode::<u32>(b"7").is_err());
        let bad = Raw::decode::<String>(&[0xff, 0xfe]).unwrap_err();
        assert!(bad.0.contains("not UTF-8"), "{bad}");
        assert!(Raw::decode_owned::<S>(b"{}".to_vec()).is_err());
        assert!(Raw::decode_owned::<u32>(b"7".to_vec()).is_err());
        let bad = Raw::decode_owned::<String>(vec![0xff, 0xfe]).unwrap_err();
        assert!(bad.0.contains("not UTF-8"), "{bad}");
    }

    /// An owned body becomes the value without a copy: the same allocation.
    #[test]
    fn owned_bodies_are_taken_over_not_copied() {
        let body = vec![7u8; 1 << 20];
        let at = body.as_ptr();
        let b: Bytes = Raw::decode_owned(body).unwrap();
        assert_eq!(b.as_ptr(), at, "Bytes took the body over");
        let body = vec![b'x'; 1 << 20];
        let at = body.as_ptr();
        let s: String = Raw::decode_owned(body).unwrap();
        assert_eq!(s.as_ptr(), at, "String took the body over");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(Raw::decode_owned::<Vec<u8>>(all.clone()).unwrap(), all);
        assert_eq!(Raw::decode_owned::<Bytes>(all.clone()).unwrap(), all);
    }
}
