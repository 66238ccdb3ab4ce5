// The spellings of a mode's values, written once per enum as a small table next to the enum;
// parsing, printing, --help and error messages all read that table.
//
//   enum class Offload { none, optimizer, params };
//   inline std::span<const EnumName<Offload>> enum_names(Offload) {
//     static constexpr EnumName<Offload> names[] = {
//         {Offload::none, "none"}, {Offload::optimizer, "optimizer"}, {Offload::params, "params"}};
//     return names;
//   }
//
// enum_names is found by argument-dependent lookup, so the enum and its table live together.
#pragma once

#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace frugal {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) } -> std::convertible_to<std::span<const EnumName<E>>>;
};

// "qlora" for TrainType::qlora.
template <NamedEnum E>
std::string_view enum_name(E value) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (n.value == value) return n.name;
  FRUGAL_CHECK(false, "enum value ", static_cast<long long>(value), " has no name");
  return {};
}

// The value spelled `name`, if any.
template <NamedEnum E>
std::optional<E> enum_from_name(std::string_view name) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (n.name == name) return n.value;
  return std::nullopt;
}

// Every spelling in the table's order: "full, lora, qlora, hqq_lora".
template <NamedEnum E>
std::string enum_name_list() {
  std::string list;
  for (const EnumName<E>& n : enum_names(E{})) {
    if (!list.empty()) list += ", ";
    list += n.name;
  }
  return list;
}

// The value of a configuration key; anything else is an Error naming the key and the choices:
// "config key 'train.type': value 'x' is not one of full, lora, qlora, hqq_lora".
template <NamedEnum E>
E enum_from_config(std::string_view key, std::string_view name) {
  if (std::optional<E> value = enum_from_name<E>(name)) return *value;
  fail("config key '", key, "': value '", name, "' is not one of ", enum_name_list<E>());
}

// Log lines and error messages print a mode by its name.
template <NamedEnum E>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << enum_name(value);
}

}  // namespace frugal
