fn main() {
    println!("kernelsight");
}
