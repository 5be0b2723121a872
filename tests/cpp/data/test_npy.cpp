// Catch2 tests of the torch-free .npy header parser.
#include <string>

#include "catch_shim.h"
#include "data/npy.h"
#include "data_test_utils.h"

using namespace torchspeed::data;
using torchspeed::data::testing::bytes;

namespace {
std::string make_npy(const std::string& dict, size_t data_bytes, int version = 1) {
  std::string h = dict;
  const size_t pre = version == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string s("\x93NUMPY", 6);
  s += static_cast<char>(version);
  s += '\0';
  s += static_cast<char>(h.size() & 0xff);
  s += static_cast<char>((h.size() >> 8) & 0xff);
  if (version != 1) s += std::string(2, '\0');
  s += h;
  s += std::string(data_bytes, '\x01');
  return s;
}
}  // namespace

TEST_CASE("npy headers: dtype, shape, offset", "[data][npy]") {
  const std::string a = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48);
  const NpyArray p = parse_npy(bytes(a), a.size(), "a.npy");
  CHECK(p.type == NpyType::kFloat32);
  CHECK(p.itemsize == 4);
  CHECK(p.shape == std::vector<int64_t>{3, 4});
  CHECK(p.data_offset == a.size() - 48);
  CHECK(p.data_offset % 64 == 0);
  CHECK(p.data_bytes == 48);

  const std::string b = make_npy("{'descr': '|u1', 'fortran_order': False, 'shape': (7,), }", 7, 2);
  const NpyArray q = parse_npy(bytes(b), b.size(), "b.npy");
  CHECK(q.type == NpyType::kUInt8);
  CHECK(q.shape == std::vector<int64_t>{7});
  CHECK(q.data_offset == b.size() - 7);

  const std::string s = make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", 8);
  CHECK(parse_npy(bytes(s), s.size(), "s.npy").shape.empty());

  // Empty arrays: numpy writes only the header, whatever the other dimensions are.
  for (const char* shape : {"(0,)", "(6, 3, 0)", "(100000, 0)", "(0, 100000, 7)"}) {
    const std::string e = make_npy(
        std::string("{'descr': '<i8', 'fortran_order': False, 'shape': ") + shape + ", }", 0);
    const NpyArray z = parse_npy(bytes(e), e.size(), "e.npy");
    CHECK(z.data_bytes == 0);
    CHECK(z.numel() == 0);
    CHECK(z.data_offset == e.size());
  }
}

TEST_CASE("npy rejects what it cannot read, naming the file", "[data][npy]") {
  auto fails = [](const std::string& s, const std::string& part) {
    try {
      parse_npy(bytes(s), s.size(), "x.npy");
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      return m.find("x.npy") != std::string::npos && m.find(part) != std::string::npos;
    }
    return false;
  };
  CHECK(
      fails(make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "fortran"));
  CHECK(fails(make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8),
              "big-endian"));
  CHECK(fails(make_npy("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16), "dtype"));
  CHECK(fails(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 47),
              "truncated"));
  CHECK(fails(std::string("NOTNPY0000"), "magic"));
  CHECK(fails(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999, "
                       "99999999999999), }",
                       4),
              "truncated"));
}

TEST_CASE("npy header from the first bytes of a larger file", "[data][npy]") {
  const std::string a =
      make_npy("{'descr': '<i2', 'fortran_order': False, 'shape': (1000, 3), }", 6000);
  const size_t head = a.size() - 6000;
  const NpyArray p = parse_npy_header(bytes(a), head, a.size(), "big.npy");
  CHECK(p.shape == std::vector<int64_t>{1000, 3});
  CHECK(p.data_offset == head);
  CHECK(p.data_bytes == 6000);
  auto fails = [&](size_t available, uint64_t file_size, const std::string& part) {
    try {
      parse_npy_header(bytes(a), available, file_size, "big.npy");
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      return m.find("big.npy") != std::string::npos && m.find(part) != std::string::npos;
    }
    return false;
  };
  // The data is checked against the file size, not against the bytes at hand.
  CHECK(fails(head, a.size() - 1, "truncated"));
  // A header that does not fit in the bytes at hand.
  CHECK(fails(20, a.size(), "too large"));
}
