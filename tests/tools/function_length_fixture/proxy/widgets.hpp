// A fixture of tools/check_function_length.py (its --selftest): not built.
#pragma once

#include <string>
#include <vector>

namespace fixture {

enum class Shape : unsigned char { square, circle };
enum Legacy { legacy_a, legacy_b };

constexpr int kSizes[] = {1, 2, 3};
const std::vector<int> kMore = {4, 5, 6};

class Widget final : public Base<Widget> {
 public:
  Widget(int w, int h)
      : w_(w),
        h_{h},
        name_("widget {") {
  }
  // A constructor whose initialisers are braces only.
  explicit Widget(std::string n) : w_{0}, h_{0}, name_{std::move(n)} {}
  ~Widget() override
  {
    w_ = 0;
  }
  int size() const noexcept { return w_ * h_; }
  const std::string& name() const&
  {
    return name_;
  }
  struct Inner {
    Inner() = default;
    Inner(int x) : x{x} {}
    static int twice(int v) { return 2 * v; }
    int x{0};
  };
  int area() const;
  std::function<void()> on_change = [this] {
    w_ = h_;
  };

 private:
  int w_{0};
  int h_ = {0};
  std::string name_;
};

inline auto make_widget(int w) -> Widget {
  return Widget{w, w};
}

inline int Widget::area() const {
  int a = w_;
  int b = h_;
  // }
  return a * b;
}

inline std::string page() {
  return R"html(<html>
  <style> body { margin: 0 } </style>
  <script>
    function f() { return "}"; }
  </script>
</html>)html" + std::string(R"(a { raw )") + R"x(one )" more)x" + LR"(}})" +
         std::string(u8R"--(}{)--") +
         [] {
           return std::string("{");
         }() +
         std::string("}}") + R"(
}
}
)";
}

template <typename T>
inline std::string escape(const T& v) {
  std::string out;
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

template <typename... Ts>
int sum(Ts... ts) {
  return (0 + ... + ts);
}

}  // namespace fixture
